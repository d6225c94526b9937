"""The store's tiers: a directory (local or a shared filesystem such as FSx for Lustre) and an S3
bucket, each one implementation of `tiers.base.Tier`. `store.tiered.Store` puts them in order."""
