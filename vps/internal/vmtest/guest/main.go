// Command guest is the init of the vps tests' VMs: it says it is up on the serial console, counts
// (so that a restored VM is seen to go on counting from where it was saved, not from one) and
// answers each line it reads. Built static (CGO_ENABLED=0) into an initramfs by vmtest.
package main

import (
	"bufio"
	"fmt"
	"os"
	"sync"
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
	go func() {
		sc := bufio.NewScanner(con)
		for sc.Scan() {
			say("bc-guest: you said %q", sc.Text())
		}
	}()
	for i := 1; ; i++ {
		say("bc-guest: tick %d", i)
		time.Sleep(time.Second)
	}
}
