package capacity

// BillIn is Bill with a batch size of the test's choosing.
var BillIn = bill
