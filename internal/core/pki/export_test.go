package pki

// IssuedEarly is how far before its issue a certificate's validity starts, for tests that work
// out when one is due for renewal.
const IssuedEarly = issuedEarly
