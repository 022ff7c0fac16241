"""The compiled-model cache (docs/cache.md).

fingerprint: what identifies a graph · manifest: entries and lookup rules (pure) · store: the
directory, locks and crash-safe writes · sources: content hashes · lookup: find, import, verify,
drop · loader: ``load_compiled``, the engine's entry point · maintenance: ls/show/verify/gc/rm.
"""
