"""Training one run: the loop (:mod:`.loop`), its ranks (:mod:`.distributed`), its bookkeeping (:mod:`.recorder`)."""
