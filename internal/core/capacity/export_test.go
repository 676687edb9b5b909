package capacity

// BillIn is Bill with a batch size of the test's choosing.
var BillIn = bill

// SetLeaseDelta turns the delta read of each batch placed from memory on or off: off, memory
// learns of other writers only when a write is refused, or from the worker.
func SetLeaseDelta(l *Leases, on bool) { l.noDelta.Store(!on) }
