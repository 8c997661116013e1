"""Padding-free micro-batches: a micro-batch's rows laid end to end in a few sequences, each row's
positions restarting at 0, so the model runs on real tokens only.

transformers reads restarting `position_ids` with no attention mask as packed sequences and
gives each row a block of its own in the causal mask (`masking_utils.find_packed_sequence_indices`),
so a packed forward is the padded forward's maths on fewer tokens. Rows are binned first-fit
decreasing into sequences no longer than the micro-batch's widest row: a bin's attention costs at
most what one padded row's does, and the linear layers see only real tokens.

Only the logits that predict a completion token are computed (`logits_to_keep` as a boolean
mask), and they are put back at their (row, column) in the padded layout, so the loss, its masks
and every statistic downstream are the padded path's, unchanged. Masked positions read 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# pack only when it cuts the tokens a forward runs on by this share: with a dense attention mask
# (plain SDPA on a CPU) packing equal-length rows gains nothing and its mask costs a little
MIN_SAVING = 0.15


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor     # (N, W) rows end to end, then pad
    position_ids: torch.Tensor  # (N, W) 0.. per row (and per bin's tail of pad)
    keep: torch.Tensor          # (N, W) bool: positions whose logits predict a completion token
    targets: torch.Tensor       # (M,) the completion token each kept position predicts, in keep's order
    rows: torch.Tensor          # (M,) its row in the padded batch
    cols: torch.Tensor          # (M,) its completion column
    starts: torch.Tensor        # (B,) where each row's first real token lies in the flattened (N * W) layout

    def to(self, device) -> "Packed":
        return Packed(*(t.to(device) for t in (self.input_ids, self.position_ids, self.keep, self.targets,
                                                self.rows, self.cols, self.starts)))


def bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Row indices per bin, first-fit decreasing, each bin's total length within `capacity`
    (a row longer than it gets a bin of its own). Deterministic: ties keep row order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    free: list[int] = []
    for i in order:
        slot = next((b for b, room in enumerate(free) if lengths[i] <= room), None)
        if slot is None:
            out.append([i])
            free.append(capacity - lengths[i])
        else:
            out[slot].append(i)
            free[slot] -= lengths[i]
    return out


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    return attention_mask.sum(-1).tolist()


def packed_width(lengths: list[int]) -> tuple[int, int]:
    """(N bins, W width) the rows pack into."""
    packed = bins(lengths, max(lengths))
    return len(packed), max(sum(lengths[i] for i in b) for b in packed)


def worth_packing(attention_mask: torch.Tensor, n_completion: int, shared_prompt_rows: int | None = None) -> bool:
    """The gate: pack when the packed forward runs on at least MIN_SAVING fewer token positions
    than the padded one would. `shared_prompt_rows` (rows per group) when the padded path runs
    each group's prompt once: its cost is then B/G prompts plus B completions."""
    b, width = attention_mask.shape
    padded = b * width
    if shared_prompt_rows:
        padded = b // shared_prompt_rows * (width - n_completion) + b * n_completion
    n, w = packed_width(row_lengths(attention_mask))
    return n * w <= (1.0 - MIN_SAVING) * padded


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int, pad_id: int = 0) -> Packed:
    """input_ids, attention_mask: (B, P+T), prompts left-padded and completions right-padded
    (`Experience.input_ids`). Every row's real tokens are contiguous."""
    b, width = input_ids.shape
    p = width - n_completion
    mask = attention_mask.bool()
    prompt_len = mask[:, :p].sum(-1).tolist()
    completion_len = mask[:, p:].sum(-1).tolist()
    lengths = [pl + cl for pl, cl in zip(prompt_len, completion_len)]
    layout = bins(lengths, max(lengths))
    w = max(sum(lengths[i] for i in bin_) for bin_ in layout)
    ids = torch.full((len(layout), w), pad_id, dtype=input_ids.dtype)                   # (N, W)
    pos = torch.zeros((len(layout), w), dtype=torch.long)                               # (N, W)
    keep = torch.zeros((len(layout), w), dtype=torch.bool)                              # (N, W)
    starts = torch.zeros(b, dtype=torch.long)                                           # (B,)
    rows, cols = [], []
    for n, bin_ in enumerate(layout):
        at = 0
        for r in sorted(bin_):  # row order inside a bin: keep's row-major order is then ascending
            real = input_ids[r][mask[r]]                                                # (L_r,)
            starts[r] = n * w + at
            ids[n, at:at + lengths[r]] = real
            pos[n, at:at + lengths[r]] = torch.arange(lengths[r])
            # the position before completion token t holds its logits
            keep[n, at + prompt_len[r] - 1: at + lengths[r] - 1] = True
            rows.append(torch.full((completion_len[r],), r, dtype=torch.long))
            cols.append(torch.arange(completion_len[r]))
            at += lengths[r]
        pos[n, at:] = torch.arange(w - at)  # the tail of pad is a sequence of its own
    rows_t, cols_t = torch.cat(rows), torch.cat(cols)                                   # (M,), (M,)
    targets = input_ids[rows_t, p + cols_t]                                             # (M,)
    return Packed(ids, pos, keep, targets, rows_t, cols_t, starts)


def unpack(values: torch.Tensor, packed: Packed, shape: tuple[int, int]) -> torch.Tensor:
    """values (M,) in keep's order (bin by bin, rows ascending in a bin) -> (B, T) at each (row,
    column), 0 where nothing was kept. Differentiable: the gradient reaches each kept value."""
    out = values.new_zeros(shape)                                                       # (B, T)
    return out.index_put((packed.rows, packed.cols), values)
