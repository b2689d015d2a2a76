"""
The benchmark lab: named grids read from a data file, the grid runner (RL Zoo's ``ExperimentManager``, resumable),
the analysis (rliable metrics with stratified-bootstrap CIs, tables, plots) and the LLM demo's task generator.

It lives beside the package (``scripts/vaco_lab``), not in the wheel, and needs the ``bench`` extra (rl_zoo3, pandas,
rliable, matplotlib, tqdm); the scripts next to it import it as a module, the tests through pytest's ``pythonpath``.
Command-line entry points: ``scripts/benchmark.py`` (over :mod:`.grids` and :mod:`.runner`), ``scripts/analyze.py``
(:mod:`.analysis`; :mod:`.wallclock` with ``--wallclock``) and ``scripts/study_plots.py`` (:mod:`.study`); the grids
are in ``scripts/grids.yml``. ``docs/benchmarks.md`` describes them.
"""
