"""service/train/phases.py: a trial's wall time split into its phases on rank 0."""

from __future__ import annotations

import time

import pytest

from service.train.phases import PhaseClock


def test_windows_are_taken_out_of_the_loop_and_the_rest_is_training():
    started = time.time() - 2.0  # the trainer was made 2 s before the loop
    clock = PhaseClock(started)
    with clock.time("eval"):
        time.sleep(0.05)
    with clock.time("paired"):
        time.sleep(0.02)
    time.sleep(0.03)  # the steps
    clock.loop_ended()
    time.sleep(0.01)  # the summary
    s = clock.summary()
    assert s["phase_eval_s"] >= 0.05 and s["phase_paired_s"] >= 0.02
    assert s["phase_timeline_s"] == s["phase_checkpoint_s"] == 0.0
    loop = s["phase_eval_s"] + s["phase_paired_s"] + s["phase_train_s"]
    assert s["phase_train_s"] >= 0.03 and loop == pytest.approx(0.1, abs=0.05)
    assert s["phase_startup_s"] == pytest.approx(2.0, abs=0.05) and s["phase_finish_s"] >= 0.01
    assert s["phase_ended_at"] == pytest.approx(time.time(), abs=0.5)


def test_without_a_sweep_there_is_no_startup_phase():
    assert "phase_startup_s" not in PhaseClock(None).summary()
