"""What only the notebooks use, kept apart from the library's core maths.

* :mod:`~course_lib.teaching.notebook`: where figures go, exercise checks, showing a figure from
  a widget callback;
* :mod:`~course_lib.teaching.kernel_swap`: ``agree`` (kernel against reference, outputs and
  gradients) and ``time_ms`` (GPU timings) for the notebooks' "swap in the kernel" sections;
* :mod:`~course_lib.teaching.source_view`: ``show_source``, a kernel's source read from its file;
* :mod:`~course_lib.teaching.plots` and the ``*_figures`` modules: each notebook's figures and
  explorers; :mod:`~course_lib.teaching.window_task`: the small training task of notebook 02;
* :mod:`~course_lib.teaching.solutions`: worked solutions of the exercises, one module per notebook;
* :mod:`~course_lib.teaching.execute`: ``python -m course_lib.teaching.execute NOTEBOOK.ipynb``
  re-executes notebooks and stores their outputs (what gets committed), in the form JupyterLab
  saves (:mod:`course_lib.classroom.notebook_format`).

Nothing in the core (encodings, attention, layers, model, kernels) imports this package.
"""
