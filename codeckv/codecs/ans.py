"""Entropy coding of integer codes with static, calibrated tables: one rANS stream per archived chunk.

    table = EntropyTable.fit(calibration_codes)        # (N, r) int codes -> one categorical model per column
    stream = table.encode(codes)                       # (m, r) int codes -> bytes (what the archive holds)
    codes = table.decode(stream, m)                    # the exact (m, r) codes back

Column i codes symbols q + M_i for q in [-M_i, M_i] (M_i: a high quantile of |q_i| on calibration) and
one escape symbol for anything outside, followed by the value itself in 16 bits. The coder is
`constriction`'s stack-based ANS (Duda 2013): within a few bytes of the ideal code length
-log2 p(codes) per chunk. The tables are calibration constants, stored with the basis, not per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import constriction
import numpy as np
import torch

ESCAPE_RANGE = 1 << 16  # escaped values are stored in 16 bits (clipped to +-32767)
LENGTH_BYTES = 4  # every stored stream carries its length (counted in nbytes)
_CATEGORICAL = constriction.stream.model.Categorical(perfect=False)
_ESCAPED = constriction.stream.model.Uniform(ESCAPE_RANGE)


@dataclass
class EntropyTable:
    """One categorical model per column: probs (r, n), offset (r,) = M_i (symbol q + M_i, escape 2 M_i + 1)."""

    probs: torch.Tensor  # (r, n) float32, rows sum to 1, zero past each row's escape symbol
    offset: torch.Tensor  # (r,) int64
    _tiled: dict = field(default_factory=dict, repr=False, compare=False)  # m -> (m * r, n) probs, reused per chunk

    @classmethod
    def fit(cls, codes: torch.Tensor, coverage: float = 0.9999, max_abs: int = 255, alpha: float = 0.5) -> EntropyTable:
        """Histogram (N, r) calibration codes into tables: M_i = the `coverage` quantile of |q_i| (1..max_abs).

        alpha: add-alpha smoothing, so a code never seen in calibration still costs finitely many bits.
        """
        codes = codes.long()
        r = codes.shape[1]
        m = torch.quantile(codes.abs().float(), coverage, dim=0).ceil().long().clamp(1, max_abs)  # (r,)
        n = int(2 * m.max() + 2)
        symbols = torch.where(codes.abs() <= m, codes + m, 2 * m + 1)  # (N, r); 2M + 1 = escape
        counts = torch.bincount((symbols + torch.arange(r) * n).reshape(-1), minlength=r * n).view(r, n).double()
        valid = torch.arange(n)[None, :] <= 2 * m[:, None] + 1  # (r, n): the symbols of each column
        probs = (counts + alpha) * valid
        return cls((probs / probs.sum(1, keepdim=True)).float(), m)

    @property
    def columns(self) -> int:
        return self.probs.shape[0]

    def bits(self, codes: torch.Tensor) -> torch.Tensor:
        """Ideal code length in bits of each column of (m, r) codes under this table, escapes included -> (r,)."""
        codes = codes.long()
        m = self.offset
        symbols = torch.where(codes.abs() <= m, codes + m, 2 * m + 1)
        p = self.probs.double().gather(1, symbols.T).T  # (m, r)
        escape = (codes.abs() > m).double() * np.log2(ESCAPE_RANGE)
        return (-torch.log2(p) + escape).sum(0)

    def _probs_for(self, rows: int) -> np.ndarray:
        """The (rows * r, n) float32 probabilities of `rows` consecutive code rows (memoized by rows)."""
        if rows not in self._tiled:
            self._tiled[rows] = np.tile(self.probs.numpy(), (rows, 1))
        return self._tiled[rows]

    def encode(self, codes: torch.Tensor) -> bytes:
        """(m, r) integer codes -> one ANS stream."""
        flat = codes.reshape(-1).long().numpy()
        offset = np.tile(self.offset.numpy(), codes.shape[0])
        outside = np.abs(flat) > offset
        symbols = np.where(outside, 2 * offset + 1, flat + offset).astype(np.int32)
        coder = constriction.stream.stack.AnsCoder()
        escaped = np.clip(flat[outside] + ESCAPE_RANGE // 2, 0, ESCAPE_RANGE - 1).astype(np.int32)
        if escaped.size:
            coder.encode_reverse(escaped, _ESCAPED)  # decoded after the symbols (a stack)
        coder.encode_reverse(symbols, _CATEGORICAL, self._probs_for(codes.shape[0]))
        return coder.get_compressed().tobytes()

    def decode(self, stream: bytes, rows: int) -> torch.Tensor:
        """Inverse of encode: one ANS stream -> (rows, r) int32 codes."""
        coder = constriction.stream.stack.AnsCoder(np.frombuffer(stream, dtype=np.uint32).copy())
        symbols = coder.decode(_CATEGORICAL, self._probs_for(rows)).astype(np.int64)
        offset = np.tile(self.offset.numpy(), rows)
        outside = symbols == 2 * offset + 1
        codes = symbols - offset
        if outside.any():
            codes[outside] = coder.decode(_ESCAPED, int(outside.sum())).astype(np.int64) - ESCAPE_RANGE // 2
        return torch.from_numpy(codes.astype(np.int32)).view(rows, self.columns)

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors to save (torch.save with weights_only loading)."""
        return {"probs": self.probs, "offset": self.offset}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> EntropyTable:
        return cls(state["probs"], state["offset"])
