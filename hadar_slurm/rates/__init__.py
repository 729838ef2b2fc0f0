"""What the scheduler knows of how fast each job type runs on each GPU type: the throughput
table (:mod:`.table`), the store of measured rates (:mod:`.store`, :mod:`.store_recovery`),
estimates of the missing ones (:mod:`.estimate`), online learning from running jobs
(:mod:`.learn`), GPUs read through NVML (:mod:`.nvml`) and the ``profile`` measurements
(:mod:`.profile`)."""
