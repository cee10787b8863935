"""The training side: everything that runs inside the training process.

The hook contract (`hook.HookBase` and the plugin protocol), its options, the step driver
with its counters and phases, tensor saving, stop requests, the writer, the system
monitor, profiling windows, the cost meter and the fail-safe. It imports nothing of the
analysis side (rules, report, export, ui, traces, trial): what runs at close beyond
tensors goes through `hook_outputs.register_output` (checked in lint by import-linter).
Importing this package imports none of its modules."""
