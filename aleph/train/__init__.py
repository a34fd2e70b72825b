"""aleph.train: `aleph train`, the E1 trainer (see README.md in this directory).

Files by role: config (the frozen config and presets), identity (run lock, launch ids and
logs, code provenance), preflight (device, allocator cap, VRAM probe, store planning),
distributed (rank/world over torch.distributed), loop (data order, optimiser, schedule,
one checked step, stop signals), checkpoint (resume state), outputs (manifest, metrics,
TensorBoard), session and fit (one launch), run (the entry point `train(cfg)`).
"""
