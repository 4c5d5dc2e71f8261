"""The decision pipeline (:mod:`.decider`): the denial cache (:mod:`.denials`), background
counting (:mod:`.background`), the failure policy (:mod:`.policy`) and the local fallback
it may decide on (:mod:`.fallback`), then the store, then the hooks (:mod:`.hooks`); a
settle's write (:mod:`.settle_writes`) and waiting for admission (:mod:`.waiting`).
"""
