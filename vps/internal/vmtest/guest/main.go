// Command guest is the init of the vps tests' VMs: it says it is up on the serial console, counts
// (so that a restored VM is seen to go on counting from where it was saved, not from one),
// prints the environment its host gave it (bc.env on the kernel's command line; again when it
// reads "env") and answers each line it reads. Built static (CGO_ENABLED=0) into an initramfs by vmtest.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	con, err := os.OpenFile("/dev/ttyS0", os.O_RDWR, 0)
	if err != nil {
		con = os.Stdout
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(con, format+"\r\n", args...)
	}
	say("bc-guest: up")
	vars := env()
	for _, kv := range vars {
		say("bc-guest: env %s", kv)
	}
	envOf := func(k string) string {
		for _, kv := range vars {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	if ca := envOf("BC_SSH_CA"); ca != "" { // a sandbox: SSH on the second serial port
		go serveSSH("/dev/ttyS1", ca, envOf("BC_SSH_PRINCIPAL"), say)
	}
	go func() {
		sc := bufio.NewScanner(con)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "env" { // asked again, by whoever attached later
				for _, kv := range vars {
					say("bc-guest: env %s", kv)
				}
				continue
			}
			say("bc-guest: you said %q", sc.Text())
		}
	}()
	for i := 1; ; i++ {
		say("bc-guest: tick %d", i)
		time.Sleep(time.Second)
	}
}

// env reads bc.env (base64url of a JSON object) from the kernel's command line, as KEY=VALUE
// in key order.
func env() []string {
	_ = os.MkdirAll("/proc", 0o555)
	_ = syscall.Mount("proc", "/proc", "proc", 0, "")
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range strings.Fields(string(b)) {
		v, ok := strings.CutPrefix(f, "bc.env=")
		if !ok {
			continue
		}
		raw, err := base64.RawURLEncoding.DecodeString(v)
		var m map[string]string
		if err != nil || json.Unmarshal(raw, &m) != nil {
			return []string{"(bc.env unreadable)"}
		}
		for k, v := range m {
			out = append(out, k+"="+v)
		}
	}
	sort.Strings(out)
	return out
}
