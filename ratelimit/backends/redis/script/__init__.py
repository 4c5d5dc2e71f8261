"""The Redis script engine (``use_scripts=True``, the default): :mod:`.engine` decides with
one script call per decision (:mod:`.scripts` names them and what each algorithm sends,
:mod:`.replies` reads what they answer), sent through the automatic pipeline
(:mod:`.pipeline`, :mod:`.fast_pipeline`) in batches (:mod:`.batch`), or by the calling
threads of the sync API (:mod:`.blocking`).
"""
