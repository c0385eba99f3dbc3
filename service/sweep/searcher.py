"""The adaptive seeds as a Ray Tune Searcher: Tune keeps its bookkeeping (trials, concurrency,
results, the experiment state), the rounds (service/sweep/adaptive.py) decide what runs next.

Tune asks ``suggest`` for a trial whenever it could start one. The searcher hands out the
current round's trials; when they are all out it answers ``None`` (wait) until the last one
has completed, then plans the next round from the outcomes, and answers ``FINISHED`` when
there is none. Trials already done in an interrupted sweep (``--resume``) are given as
``done``: the rounds are replayed over them and only what is missing runs.
"""

from __future__ import annotations

import math
from collections import deque

from ray.tune.search import Searcher

from service.sweep.adaptive import Outcome, SeedRounds


class SeedSearcher(Searcher):
    def __init__(self, rounds: SeedRounds, done: dict[str, Outcome] | None = None, board=None):
        super().__init__()
        self._rounds = rounds
        self._outcomes: dict[str, Outcome] = dict(done or {})
        self._queue: deque = deque()
        self._running: dict[str, str] = {}     # Tune trial id -> trial key
        self._board = board                    # service.sweep.progress.ProgressBoard: the round is shown

    def suggest(self, trial_id: str):
        while not self._queue:
            if self._running:
                return None  # the round's last trials still run: the next round needs them
            round_ = self._rounds.plan(self._outcomes)
            if not round_:
                return Searcher.FINISHED
            self._queue.extend(t for t in round_ if t.key not in self._outcomes)
            if self._board is not None:
                self._board.round_started.remote(self._rounds.round, self._rounds.rule.looks,
                                                 len(self._rounds.planned))
        trial = self._queue.popleft()
        self._running[trial_id] = trial.key
        return {"trial": trial.to_dict()}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        key = self._running.pop(trial_id, None)
        if key is None:
            return
        if error or not result:
            self._outcomes[key] = Outcome("failed")
            return
        loss = result.get("final_eval_loss")
        self._outcomes[key] = Outcome(str(result.get("status", "failed")),
                                      float(loss) if loss is not None else math.nan)
