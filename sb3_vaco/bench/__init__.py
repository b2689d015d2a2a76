"""
The benchmark lab: named grids read from a data file, the grid runner (RL Zoo's ``ExperimentManager``, resumable),
and the analysis (rliable metrics with stratified-bootstrap CIs, tables, plots).

It needs the ``bench`` extra (rl_zoo3, pandas, rliable, matplotlib, tqdm); ``import sb3_vaco`` never imports it, and
nothing in sb3_vaco's core does. Command-line entry points: ``scripts/benchmark.py`` (over :mod:`.grids` and
:mod:`.runner`), ``scripts/analyze.py`` (:mod:`.analysis`; :mod:`.wallclock` with ``--wallclock``) and
``scripts/study_plots.py`` (:mod:`.study`); the grids are in ``scripts/grids.yml``. ``docs/benchmarks.md`` describes
them.
"""
