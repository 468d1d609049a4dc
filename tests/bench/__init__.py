"""`dpda bench …`: benchmarks that print numbers and write JSON (service overhead, speed,
accuracy, figures, label leak, load)."""
