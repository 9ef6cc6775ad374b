"""The study driver and the Ray tasks it starts: scheduling, packs, leases, data preparation,
calibration and submission. Nothing here runs inside a Ray Train worker."""
