"""On PYTHONPATH, a Python that behaves as if vLLM were not installed (the test environment has
its CPU build): `import vllm` fails and `importlib.util.find_spec("vllm")` is None, as for a user
without the extra."""
import sys

sys.modules["vllm"] = None
