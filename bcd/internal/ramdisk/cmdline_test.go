package ramdisk

import (
	"strings"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, cmdline        string
		site, machine, token string
		wantErr              string
	}{
		{name: "known machine",
			cmdline: "BOOT_IMAGE=/vmlinuz console=ttyS0 bcd.site=http://10.0.0.1:8067 bcd.machine=m-42 bcd.token=tok quiet\n",
			site:    "http://10.0.0.1:8067", machine: "m-42", token: "tok"},
		{name: "unknown machine", cmdline: "bcd.site=http://10.0.0.1:8067/ bcd.token=tok", site: "http://10.0.0.1:8067", token: "tok"},
		{name: "quoted, and the last one counts",
			cmdline: `bcd.site=http://old bcd.site="https://site.example:8443" bcd.machine="m 1" bcd.token=t`,
			site:    "https://site.example:8443", machine: "m 1", token: "t"},
		{name: "init's arguments are not read",
			cmdline: "bcd.site=http://10.0.0.1:8067 bcd.token=tok -- bcd.machine=m-1 bcd.token=t", site: "http://10.0.0.1:8067", token: "tok"},
		{name: "an unbalanced quote before them hides them, as from the kernel",
			cmdline: `console="ttyS0 bcd.site=http://10.0.0.1:8067 bcd.token=t`, wantErr: "bcd.site= is missing"},
		{name: "no site", cmdline: "console=ttyS0 bcd.machine=m-1", wantErr: "bcd.site= is missing"},
		{name: "site not http", cmdline: "bcd.site=tftp://10.0.0.1", wantErr: "not an http(s) URL"},
		{name: "site without host", cmdline: "bcd.site=http://", wantErr: "not an http(s) URL"},
		{name: "no token", cmdline: "bcd.site=http://h bcd.machine=m-1", wantErr: "bcd.token= is missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			site, machine, token, err := ParseCmdline(c.cmdline)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if site != c.site || machine != c.machine || token != c.token {
				t.Errorf("got (%q, %q, %q), want (%q, %q, %q)", site, machine, token, c.site, c.machine, c.token)
			}
		})
	}
}
