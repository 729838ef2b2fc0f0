"""Hyperparameter-tuning studies (issue #17): a study's spec and halving rules, synthetic
learning curves, the studies simulator and the static-allocation baseline."""
