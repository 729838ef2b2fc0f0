"""The command line: ``hadar-slurm`` (:mod:`.main`) and its command groups: hints
(:mod:`.hints`), GPUs and profiling (:mod:`.nvml`), the throughput store (:mod:`.store`),
reports (:mod:`.report`) and the generated reference docs (:mod:`.docs_gen`)."""
