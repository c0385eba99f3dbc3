"""The sweep service: Ray Tune over Ray Train DDP trials, every trial recorded in MLflow."""
