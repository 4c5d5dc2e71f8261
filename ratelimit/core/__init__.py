"""The vocabulary every layer speaks, and nothing that runs: plans (:mod:`.plan`, what a
store must decide for one call), decisions (:mod:`.decision`) and how counts become one
(:mod:`.evaluation`), costs (:mod:`.costs`), selector values (:mod:`.selectors`), settling
(:mod:`.settling`), concurrency slots (:mod:`.slots`), ``RateLimit``'s settings
(:mod:`.settings`) and the checks of every setting (:mod:`.checks`), and the optional extras
(:mod:`.extras`). It imports only the rules, the algorithms and the errors.
"""
