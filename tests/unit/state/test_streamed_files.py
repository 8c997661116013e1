"""Checkpoint files without whole copies in memory: the optimizer's state streamed into its file
(read back equal with `weights_only`), and the health check's reader of a safetensors file (plain
reads a chunk at a time, no mapping) giving safetensors' own values, across chunk boundaries and
dtypes, integer tensors skipped."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from hindsight.errors import NonFiniteError
from hindsight.state.checkpoint import CheckpointManager, float_chunks, load_tensor_file, require_healthy


def test_the_reader_gives_safetensors_values_a_chunk_at_a_time(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(37, 5, generator=g), "b": torch.randn(101, generator=g).bfloat16(),
               "c": torch.randn(3, 3, generator=g).half(), "ids": torch.arange(9), "empty": torch.zeros(0),
               "f8": torch.randn(13, generator=g).to(torch.float8_e4m3fn), "d": torch.randn(4, generator=g).double()}
    save_file(tensors, tmp_path / "m.safetensors")
    want = load_file(tmp_path / "m.safetensors")
    got: dict = {}
    for name, values in float_chunks(tmp_path / "m.safetensors", chunk_bytes=24):  # chunks split every tensor
        got.setdefault(name, []).append(values)
        assert values.numel() * values.element_size() <= 24 * (4 if name == "f8" else 1)
    assert set(got) == {"a", "b", "c", "f8", "d"}  # integers and the empty tensor skipped
    for name, parts in got.items():
        expect = want[name].flatten()
        torch.testing.assert_close(torch.cat(parts), expect.float() if name == "f8" else expect, rtol=0, atol=0)


def test_the_health_check_still_names_the_bad_tensor(tmp_path):
    bad = torch.ones(1000)
    bad[777] = float("nan")
    save_file({"fine": torch.ones(5), "layer.w": bad}, tmp_path / "model.safetensors")
    with pytest.raises(NonFiniteError, match=r"non-finite weights \(layer\.w\)"):
        require_healthy(tmp_path, "rl", 1e4)
    save_file({"layer.w": torch.full((3,), 5e4)}, tmp_path / "model.safetensors")
    with pytest.raises(NonFiniteError, match="a weight of 5e\\+04 \\(layer.w\\)"):
        require_healthy(tmp_path, "rl", 1e4)


def test_the_optimizer_state_is_streamed_into_its_file(tmp_path):
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    store = CheckpointManager.__new__(CheckpointManager)  # the writer reads nothing of the manager
    path = tmp_path / "optimizer" / "step-000001.pt"
    store._save_tensor_file(path, opt.state_dict())
    back = load_tensor_file(path)
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(back["state"][0][k], v)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left
