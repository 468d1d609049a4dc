"""Infrastructure both daemons share: wire (de)serialization, TLS and pinning, admission,
signatures, the audit log, the admin API, configuration, key files, crash points, progress."""
