"""dataflow: a cycle-level simulator of a reconfigurable dataflow accelerator."""
