"""The follower of a side-by-side turn (measure/side_by_side.py, stream_turn's follow_own): native's cache fed a codec
run's own reply, so the run is scored against native along the reply it wrote, not only along native's."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits
from codeckv.measure.lockstep import kl_divergence

if TYPE_CHECKING:
    from codeckv.measure.side_by_side import Run


class Follower:
    """A copy of native's cache after the prompt, fed a codec run's own tokens as the run generates them: the KLD
    and top-1 of the run against native at every position of the run's own reply (the reasoning grid's method,
    measure/reasoning.py), not only on native's reply. While the run's reply is native's token for token, native's
    own log-probs are what the copy would predict (the same tokens on the same cache), so it feeds nothing; where the
    replies part it takes the agreed tokens in one forward, then one native decode step per codec step."""

    def __init__(self, loaded: LoadedModel, native: Run) -> None:
        self.loaded, self.native, self.cache = loaded, native, copy.deepcopy(native.cache)
        self.fed: list[int] = []  # the run's reply tokens fed so far; the copy holds the first `held` of them
        self.held = 0
        self.pending: torch.Tensor | int = native.first_logprobs  # native's prediction of the run's next position,
        # or the index of native's own log-probs that are that prediction (still on native's reply)
        self.waiting: list[tuple[int, torch.Tensor]] = []  # (index, the run's log-probs) until native has that index
        self.scored: dict[int, tuple[float, bool]] = {}  # position -> (KLD, top-1 agreement)

    def feed(self, ids: torch.Tensor) -> None:
        """Feed the token the run is about to feed: native's prediction of the position after it."""
        token, position = int(ids.reshape(-1)[0]), len(self.fed)
        self.fed.append(token)
        reply = self.native.token_ids  # native has generated this position already (round robin: one step ahead)
        if self.held == 0 and position < len(reply) and reply[position] == token:  # every earlier token agreed too
            self.pending = position + 1  # native's log-probs after the same tokens
            return
        catch_up = torch.tensor([self.fed[self.held :]], device=ids.device)
        self.pending = torch.log_softmax(next_logits(self.loaded.model, catch_up, self.cache)[0], dim=-1).cpu()
        self.held = len(self.fed)

    def compare(self, logprobs: torch.Tensor) -> None:
        """The run's log-probs at the position native predicted last."""
        position = len(self.fed)  # the first compare is the prefill's prediction, then one after each feed
        if isinstance(self.pending, int):
            self.waiting.append((self.pending, logprobs))
        else:
            self._score(position, self.pending, logprobs)
        self._score_waiting()

    def scores(self) -> tuple[list[float], list[bool]]:
        """(KLD, top-1 agreement) at every position of the run's reply, once native's reply is complete."""
        self._score_waiting()
        if self.waiting:
            raise RuntimeError("native's reply ended before the run's own agreed with it")
        ordered = [self.scored[position] for position in sorted(self.scored)]
        return [kld for kld, _ in ordered], [top1 for _, top1 in ordered]

    def _score_waiting(self) -> None:
        while self.waiting and self.waiting[0][0] < len(self.native.logprobs):
            index, logprobs = self.waiting.pop(0)
            self._score(index, self.native.logprobs[index], logprobs)

    def _score(self, position: int, predicted: torch.Tensor, logprobs: torch.Tensor) -> None:
        self.scored[position] = float(kl_divergence(predicted, logprobs)), bool(predicted.argmax() == logprobs.argmax())
