"""Table adapters: the only modules that import deltalake (storage root, the app-transaction
protocol, segment files, file-changing commits)."""
