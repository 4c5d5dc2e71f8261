"""The Redis script engine (``use_scripts=True``, the default). :mod:`.engine` holds the
client, pipeline and settings; each feature is a module of its own: :mod:`.decisions`,
:mod:`.settles`, :mod:`.resets`, :mod:`.slots` (overrides and penalties are the Redis
package's, shared with the command engine). :mod:`.scripts` assembles the Lua they run from
``../lua/`` and says what each algorithm sends, :mod:`.replies` reads what they answer; calls
go out through the automatic pipeline (:mod:`.pipeline`, :mod:`.fast_pipeline`) in batches
(:mod:`.batch`), or by the calling threads of the sync API (:mod:`.blocking`).
"""
