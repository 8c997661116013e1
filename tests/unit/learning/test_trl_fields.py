"""docs/losses.md maps every GRPOConfig field TRL's loss reads to a hindsight key: the fields are
read off TRL's own source (its loss, its importance-sampling block, its advantages and its
truncation mask), so a field TRL adds to any of them fails this test until it is mapped."""
import inspect
import re
from dataclasses import fields
from pathlib import Path

from trl import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from hindsight.config import PipelineConfig

ROOT = Path(__file__).resolve().parents[3]
ALIASES = {"epsilon_low": "epsilon"}  # GRPOTrainer.__init__ renames these


def _between(src: str, start: str, end: str) -> str:
    i = src.index(start)
    return src[i:src.index(end, i)]


def fields_the_loss_reads() -> set[str]:
    gen = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    src = "".join([inspect.getsource(GRPOTrainer._compute_loss), inspect.getsource(GRPOTrainer.get_off_policy_mask),
                   inspect.getsource(GRPOTrainer.get_gamma_weights),
                   _between(gen, "if self.mask_truncated_completions", "loss_mask ="),
                   _between(gen, "if self.use_vllm and self.vllm_importance_sampling_correction:\n", "# Compute the per-token"),
                   _between(gen, "if self.multi_objective_aggregation ==", "advantages = torch.nan_to_num")])
    names = {ALIASES.get(n, n) for n in re.findall(r"self\.(?:args\.)?(\w+)", src)}
    return names & {f.name for f in fields(GRPOConfig)}


def mapped() -> dict[str, str]:
    text = (ROOT / "docs/losses.md").read_text()
    table = text[text.index("## TRL's GRPOConfig, field by field"):]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| `(rl\.[\w.<>\[\]]+)`", table, re.M)}


def not_built() -> set[str]:
    """Rows that say plainly that hindsight has no equivalent (and why)."""
    text = (ROOT / "docs/losses.md").read_text()
    return set(re.findall(r"^\| `(\w+)` \| not built: ", text, re.M))


def test_every_field_trls_loss_reads_has_a_hindsight_key():
    read = fields_the_loss_reads()
    assert {"beta", "epsilon", "loss_type", "vllm_importance_sampling_mode", "scale_rewards"} <= read  # it parses
    assert not_built() <= {"router_aux_loss_coef"}, "a gap that is not an MoE router's loss: build it"
    missing = sorted(read - set(mapped()) - not_built())
    assert not missing, f"GRPOConfig fields TRL's loss reads with no row in docs/losses.md: {missing}"


def test_every_mapped_key_is_in_the_config():
    cfg = PipelineConfig.model_validate({"rl": {"learner": {"loss": "sapo"}}})
    blocks = {"<loss>": "grpo", "sapo": "sapo", "vespo": "vespo", "cispo": "cispo"}
    for field, key in mapped().items():
        node = cfg.rl
        for part in key.split(".")[1:]:
            part = part.removesuffix("[]")
            if part in blocks and part not in ("sapo", "vespo", "cispo"):
                part = blocks[part]
            if isinstance(node, list):
                node = node[0]
            owner = node
            node = getattr(node, part, None)
            if node is None and part in ("sapo", "vespo", "cispo", "grpo"):  # a loss's block: its settings model
                from hindsight.learning.losses import get_loss

                node = get_loss(part).Settings()
            assert node is not None or part in type(owner).model_fields, f"{field} -> {key}: no {part}"
