"""The run report (the dict ``--report FILE`` writes as JSON): its recovery timings and its PNG plots.

* :mod:`.parse` reads the report into typed records, defensively: a report of an aborted run (an empty
  timeline, no epochs, missing keys) still reads, with what is missing left out.
* :mod:`.derived` computes what the plots and benchmarks show from those records (pure, no matplotlib):
  :func:`recovery_times`, the throughput series, epoch ends, per-batch intervals.
* :mod:`.plots` draws them: :func:`write_plots` writes ``report-loss.png``, ``report-throughput.png``,
  ``report-partition.png``, ``report-devices.png`` (:mod:`.devices_plot`, the pipeline bubble, when the report
  has its devices) and, only when the run had recoveries, ``report-faults.png`` beside the JSON,
  and a mode's own plot (its registry entry names it: ``edgeagent.modes.splitfed.plot``,
  ``edgeagent.modes.allreduce.plot``) when the report holds its section.
* :mod:`.style` is the look they share: colours, the figure, notes and legends.

The time axis is the report's: training seconds, evaluation excluded. After a recovery the timeline holds
the replayed batch ids again with larger times; per-batch figures use the *last* completion of each id.

Names with a leading underscore are shared between the package's modules, not part of its API.
"""

from edgeagent.ops.report.derived import DEFAULT_BATCH_SIZE, RecoveryTimes, recovery_times
from edgeagent.ops.report.plots import plot_paths, write_plots

__all__ = ["DEFAULT_BATCH_SIZE", "RecoveryTimes", "plot_paths", "recovery_times", "write_plots"]
