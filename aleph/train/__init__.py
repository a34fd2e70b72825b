"""aleph.train: `aleph train`, one launch of one run; README.md here gives each file's job."""
