"""The DDP step model, pure Python over hooks/cost.py: one measured step as a timeline of its
buckets, priced at any world size, link and per-rank batch, with its measured error.

    timeline.py   StepTimeline, BucketTiming, LinearCost (fit_linear, decode_cost): the data
    stamps.py     hooks/step_sampling.py's raw stamps of a sampled step -> StepTimeline
    price.py      price_step, price_cell (StepPrice; ComputeScaling, rank_batch, CellRefused)
    combine.py    combine: a rank's steps, then the ranks, into one timeline; combine_ranks -> TrialTimeline
    trial.py      TrialTimeline: what a trial recorded (its timeline, its compute at two batch
                  sizes), priced at the global batch; step_timeline.json (to_json / from_json)
    bands.py      ErrorBands: the model's measured error per hook (projection_error.json, written by
                  bench/projection.py)

Imports hooks/ (specs, cost, wire) and nothing else of the service: the training loop writes a
trial's timeline with it, tracking reads it back, the report projects with it.
"""
