"""The trace-driven simulator: traces (:mod:`.trace`), virtual clusters (:mod:`.cluster`), the
simulated backend of the epoch loop (:mod:`.backend`), runs and their metrics (:mod:`.run`), lower
bounds (:mod:`.bounds`) and plots (:mod:`.plots`)."""
