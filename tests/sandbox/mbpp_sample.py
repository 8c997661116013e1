"""An MBPP-style sample of our own: short tasks whose tests use forms a judge of plain values alone
gets wrong. Each has a correct solution (it must score 1.0) and a wrong one (0.0); docs/benchmarks.md
has the counts. Forms: asserts on values; names from the solution's own imports; an expected
exception (try/except, and a raises helper of the test's own); generators (list(), next, sum);
functions passed in (lambdas, keys, predicates) and returned (closures); containers of every
built-in type; floats compared with isclose; and a prompt helper the tests call."""

RAISES = ("class raises:\n    def __init__(self, kind):\n        self.kind = kind\n"
          "    def __enter__(self):\n        return self\n"
          "    def __exit__(self, kind, value, tb):\n        assert kind is not None and issubclass(kind, self.kind), kind\n"
          "        return True\n")

# name -> (correct program, wrong program, tests)
TASKS = {
    "max-of-list": ("def max_of(xs):\n    return max(xs)\n", "def max_of(xs):\n    return xs[0]\n",
                    "assert max_of([1, 5, 2]) == 5\nassert max_of([-1, -3]) == -1\n"),
    "solution-imports-math": ("import math\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)\n",
                              "import math\ndef hyp(a, b):\n    return a + b\n",
                              "assert math.isclose(hyp(3, 4), 5.0)\nassert math.isclose(hyp(1, 1), math.sqrt(2))\n"),
    "solution-imports-re": ("import re\ndef words(s):\n    return re.findall(r'[a-z]+', s)\n",
                            "import re\ndef words(s):\n    return s.split()\n",
                            "assert words('a1b c') == re.findall(r'[a-z]+', 'a1b c') == ['a', 'b', 'c']\n"),
    "solution-imports-collections": ("from collections import Counter\ndef top(s):\n    return Counter(s).most_common(1)[0][0]\n",
                                     "def top(s):\n    return s[0]\n",
                                     "assert top('abbccc') == 'c'\nassert top('zz') == 'z'\n"),
    "raises-value-error": ("def safe_sqrt(x):\n    if x < 0:\n        raise ValueError('negative input')\n    return x ** 0.5\n",
                           "def safe_sqrt(x):\n    return abs(x) ** 0.5\n",
                           "try:\n    safe_sqrt(-4)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n"
                           "    raise AssertionError('no error')\nassert safe_sqrt(9) == 3.0\n"),
    "raises-with-helper": ("def pick(d, k):\n    return d[k]\n", "def pick(d, k):\n    return d.get(k)\n",
                           RAISES + "with raises(KeyError):\n    pick({'a': 1}, 'b')\nassert pick({'a': 1}, 'a') == 1\n"),
    "raises-a-subclass": ("class NotPositive(ValueError):\n    pass\ndef check_pos(x):\n    if x <= 0:\n"
                          "        raise NotPositive(x)\n    return True\n",
                          "def check_pos(x):\n    return x > 0\n",
                          RAISES + "with raises(ValueError):\n    check_pos(0)\nassert check_pos(2) is True\n"),
    "zero-division": ("def ratio(a, b):\n    return a / b\n", "def ratio(a, b):\n    return a / b if b else 0\n",
                      "try:\n    ratio(1, 0)\n    assert False\nexcept ZeroDivisionError:\n    pass\n"),
    "generator-list": ("def evens(n):\n    for i in range(n):\n        if i % 2 == 0:\n            yield i\n",
                       "def evens(n):\n    yield from range(n)\n",
                       "assert list(evens(7)) == [0, 2, 4, 6]\n"),
    "generator-next-and-sum": ("def squares():\n    i = 0\n    while True:\n        yield i * i\n        i += 1\n"
                               "def first_squares(n):\n    g = squares()\n    return [next(g) for _ in range(n)]\n",
                               "def first_squares(n):\n    return list(range(n))\n",
                               "assert first_squares(4) == [0, 1, 4, 9]\n"),
    "generator-sum": ("def digits(n):\n    return (int(c) for c in str(n))\n",
                      "def digits(n):\n    return (1 for c in str(n))\n",
                      "assert sum(digits(1234)) == 10\nassert next(digits(90)) == 9\n"),
    "lambda-predicate": ("def count_if(xs, pred):\n    return sum(1 for x in xs if pred(x))\n",
                         "def count_if(xs, pred):\n    return len(xs)\n",
                         "assert count_if([1, 2, 3, 4], lambda x: x % 2 == 0) == 2\n"),
    "lambda-key": ("def sort_by(xs, key):\n    return sorted(xs, key=key)\n",
                   "def sort_by(xs, key):\n    return sorted(xs)\n",
                   "assert sort_by(['bb', 'a', 'ccc'], key=len) == ['a', 'bb', 'ccc']\n"
                   "assert sort_by([3, 1, 2], key=lambda v: -v) == [3, 2, 1]\n"),
    "map-function": ("def apply_all(fs, x):\n    return [f(x) for f in fs]\n",
                     "def apply_all(fs, x):\n    return [x for f in fs]\n",
                     "assert apply_all([lambda v: v + 1, lambda v: v * 10, abs], -2) == [-1, -20, 2]\n"),
    "returns-a-closure": ("def adder(n):\n    return lambda x: x + n\n", "def adder(n):\n    return lambda x: x\n",
                          "add3 = adder(3)\nassert add3(4) == 7 and adder(-1)(1) == 0\n"),
    "returns-a-set": ("def uniq(xs):\n    return set(xs)\n", "def uniq(xs):\n    return list(xs)\n",
                      "assert uniq([1, 1, 2]) == {1, 2}\n"),
    "returns-a-dict": ("def freq(s):\n    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out\n",
                       "def freq(s):\n    return {c: 1 for c in s}\n",
                       "assert freq('aab') == {'a': 2, 'b': 1}\n"),
    "returns-tuples": ("def pairs(xs):\n    return [(a, b) for a, b in zip(xs, xs[1:])]\n",
                       "def pairs(xs):\n    return [[a, b] for a, b in zip(xs, xs[1:])]\n",
                       "assert pairs([1, 2, 3]) == [(1, 2), (2, 3)]\n"),
    "float-isclose": ("def mean(xs):\n    return sum(xs) / len(xs)\n", "def mean(xs):\n    return sum(xs) // len(xs)\n",
                      "import math\nassert math.isclose(mean([0.1, 0.2, 0.3]), 0.2)\n"),
    "recursion": ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
                  "def fib(n):\n    return n\n", "assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n"),
    "string-methods": ("def title_words(s):\n    return ' '.join(w.capitalize() for w in s.split())\n",
                       "def title_words(s):\n    return s.upper()\n",
                       "assert title_words('hello big world') == 'Hello Big World'\n"),
    "bytes-result": ("def to_bytes(s):\n    return s.encode()\n", "def to_bytes(s):\n    return s\n",
                     "assert to_bytes('ab') == b'ab'\n"),
    "nested-calls-both-ways": ("def fold(f, xs, start):\n    acc = start\n    for x in xs:\n        acc = f(acc, x)\n"
                               "    return acc\ndef double(x):\n    return 2 * x\n",
                               "def fold(f, xs, start):\n    return start\ndef double(x):\n    return 2 * x\n",
                               "assert fold(lambda a, x: a + double(x), [1, 2, 3], 0) == 12\n"),
}
