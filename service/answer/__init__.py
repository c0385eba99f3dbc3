"""The answer a sweep gives: which configuration to use, per world size it ran and for the
cluster it names, decided by one rule and priced one way.

Below both service/report/ (which renders it) and service/sweep/ (whose plan round designs from
it): the sweep read back from MLflow (data.py), the measured ranking (recommend.py, sequential.py),
the projection of every configuration to the cells it never ran (projection.py), the one pricing
of the cluster path (pricing.py), the per-bucket plan's design (plan.py) and the answer itself
(decision.py: ``answer.json``).
"""
