"""Self-check of "each instance of those classes": policies of classes read by exact type or by
class name, each caught by its clause (WRAP-1, FSDP2-1, AC-1) and by no other."""
