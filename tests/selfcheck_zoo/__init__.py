"""Self-check zoo: strategies carrying checkpoint bugs reported against FSDP, DCP and Lightning."""
