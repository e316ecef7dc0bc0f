"""Object stores, the segment and index codec, the partition log and its cache."""
