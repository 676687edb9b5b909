// Package ipmisim starts OpenIPMI's BMC simulator, ipmi_sim, for tests: one BMC on a loopback
// UDP port whose chassis (power, boot device) is a script's state files, with a temperature
// sensor and one SEL record. Tests that need it skip, saying why, where ipmi_sim is missing.
package ipmisim

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/power"
)

// Username and Password are the simulated BMC's administrator.
const (
	Username = "admin"
	Password = "s3cret"
)

// lanConf is ipmi_sim's configuration: one BMC on a loopback UDP port, an administrator, and
// the machine's chassis: a script ipmi_sim runs to read and set its power and boot device,
// which keeps them in files (and a log of what it was told) beside it.
const lanConf = `name "bctest"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 %d
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "%s"
  user 2 true "admin" "s3cret" admin 10 none md2 md5 straight
`

// chassis is the machine ipmi_sim controls: "get power boot" prints power:<0|1> and boot:<device>;
// "set power 1" stores the value and logs it.
const chassis = `#!/bin/sh
dir=$(dirname "$0")
op=$1
shift
case $op in
get)
	for p in "$@"; do
		v=$(cat "$dir/$p.state" 2>/dev/null) || v=0
		[ "$p" = boot ] && [ "$v" = 0 ] && v=none
		echo "$p:$v"
	done ;;
set)
	while [ $# -gt 1 ]; do
		echo "$2" > "$dir/$1.state"
		echo "$1 $2" >> "$dir/chassis.log"
		shift 2
	done ;;
esac
`

// emu sets up the BMC: its management controller, a system event log with one record, and one
// temperature sensor, CPU1 (number 0x30), described by a full sensor record (SDR type 01h:
// degrees C, reading = raw, so 0x39 reads 57) and reading 57.
const emu = `mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02
sel_enable 0x20 1000 0x0a
main_sdr_add 0x20 0x00 0x00 0x51 0x01 0x2f 0x20 0x00 0x30 0x03 0x01 0x7f 0x68 0x01 0x01 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x01 0x00 0x00 0x01 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0xff 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0xc4 0x43 0x50 0x55 0x31
sensor_add 0x20 0 0x30 0x01 0x01
sensor_set_value 0x20 0 0x30 0x39 0
mc_enable 0x20
sel_add 0x20 0x02 0x00 0x00 0x00 0x00 0x20 0x00 0x04 0x01 0x30 0x01 0x57 0x00 0x00
`

// Start starts ipmi_sim for the test and returns how to reach it, and the directory of its
// machine's state. Without ipmi_sim (Debian's
// openipmi, which .ci/run installs) the test is skipped, saying so.
func Start(t testing.TB) (power.BMC, string) {
	t.Helper()
	bin, err := exec.LookPath("ipmi_sim")
	if err != nil {
		t.Skip("ipmi_sim is not installed (Debian package openipmi; .ci/run installs it): the IPMI driver is tested against it")
	}
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.LocalAddr().(*net.UDPAddr).Port
	ln.Close()
	dir := t.TempDir()
	for name, body := range map[string]string{"lan.conf": fmt.Sprintf(lanConf, port, filepath.Join(dir, "chassis")), "bmc.emu": emu, "chassis": chassis} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Not -n: ipmi_sim reads commands from stdin, held open until the test ends, and prints its
	// prompt once its configuration (the LAN channel, bound) and command file are read: ready.
	cmd := exec.Command(bin, "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "state"))
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "ipmi_sim.log"))
	if err != nil {
		t.Fatal(err)
	}
	out := &prompt{w: log, ready: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		stdin.Close()
		<-exited
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "ipmi_sim.log"))
			t.Logf("ipmi_sim's output:\n%s", b)
		}
	})
	select {
	case <-out.ready:
	case err := <-exited:
		exited <- err // for the cleanup
		b, _ := os.ReadFile(filepath.Join(dir, "ipmi_sim.log"))
		t.Fatalf("ipmi_sim exited before it was ready: %v\n%s", err, b)
	case <-time.After(10 * time.Second):
		t.Fatal("ipmi_sim printed no prompt within 10s")
	}
	return power.BMC{Address: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Username: Username, Password: Password}, dir
}

// prompt passes ipmi_sim's output on to w, and closes ready when it shows the console's prompt,
// "> ". exec.Cmd calls Write from one goroutine, Stdout and Stderr being the same writer.
type prompt struct {
	w     io.Writer
	last  byte
	ready chan struct{}
	shown bool
}

func (p *prompt) Write(b []byte) (int, error) {
	for _, c := range b {
		if !p.shown && p.last == '>' && c == ' ' {
			p.shown = true
			close(p.ready)
		}
		p.last = c
	}
	return p.w.Write(b)
}

// Log is what the chassis was told, in order: "power 1", "boot pxe", …
func Log(t testing.TB, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "chassis.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}
