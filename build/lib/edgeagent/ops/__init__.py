"""Operations: monitor, run report, device profiles, systemd, Home Assistant, logging."""
