"""A report rendered from crafted shards (wrong types, markup in every field, lone surrogates)
is still one valid, escaped UTF-8 page: stored data is never markup."""
import html.parser

from hindsight.lookback.report import render_step_report

EVIL = '"><script>alert(1)</script><x a="'


def test_crafted_shard_values_are_escaped_and_the_page_is_valid_utf8():
    rows = [{"group": EVIL, "index": EVIL, "prompt": f"2 + 2 \ud800 {EVIL}", "prompt_id": EVIL, "replayed": False,
             "completion_ids": [1, 2], "logprobs": ["-0.5", None], "ended_with_eos": False}]
    scores = [{"reward": "1.0", "rm_score": EVIL, "reward_exact": EVIL, "ref_logprobs": [EVIL, 0.0]}]
    page = render_step_report(f"run {EVIL}", 1, rows, scores, {EVIL: 1.0}, {"reward/mean": EVIL},
                              lambda tid: "\udcff" + EVIL)
    page.encode("utf-8")  # would raise on a surviving lone surrogate
    assert "<script>" not in page and "\\ud800" in page and "\\udcff" in page

    tags = []

    class Parser(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append(tag)

    Parser().feed(page)
    assert "script" not in tags and "x" not in tags
