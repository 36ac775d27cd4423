"""Worked solutions of the notebooks' exercises, one module per notebook (``nb00``, ``nb01``,
``nb01b``, ... ``nb10``).

Try the exercise first; read a solution with ``??`` in the notebook when you are stuck.
"""
