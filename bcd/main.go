// Command bcd is the Better Compute daemon that runs on every server. It only ever dials out: to
// join (JoinService, over HTTPS), then to hold one session with a gateway (gRPC over mutual
// TLS). Its state is one journal file in its state directory.
//
//	bcd join --url https://compute.example.com --token bcjoin_…
//	bcd node
//	bcd status [--json]
//	bcd doctor
//	bcd sim --nodes 1000 --url … --token …
//
// A host whose modules add node-side kinds builds its own: app.Main(extensions...).
package main

import "github.com/better-compute/compute/bcd/app"

func main() { app.Main() }
