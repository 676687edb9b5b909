package ramdisk

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/better-compute/compute/metal/siteapi"
)

// ParseCmdline reads what the site's iPXE script put on the kernel command line (the text of
// /proc/cmdline), as Linux splits it: the site agent's base URL (bcd.site=, required, http or
// https), the boot's token (bcd.token=, required) and the machine's id (bcd.machine=, absent
// for a machine the site does not know yet). Parameters after a lone "--" belong to init and
// are not read; when a parameter is given twice the last one counts.
func ParseCmdline(cmdline string) (site, machine, token string, err error) {
	p := siteapi.ParseCmdline(cmdline)
	site, machine, token = p[siteapi.CmdlineSite], p[siteapi.CmdlineMachine], p[siteapi.CmdlineToken]
	if site == "" {
		return "", "", "", fmt.Errorf("ramdisk: %s= is missing from the kernel command line: the site's iPXE script gives it", siteapi.CmdlineSite)
	}
	if err := checkSiteURL(site); err != nil {
		return "", "", "", fmt.Errorf("ramdisk: kernel command line: %s=%w", siteapi.CmdlineSite, err)
	}
	if token == "" {
		return "", "", "", fmt.Errorf("ramdisk: %s= is missing from the kernel command line: the site's iPXE script gives one to every boot (a site older than this bcd gives none to a machine it does not know: upgrade it)", siteapi.CmdlineToken)
	}
	return strings.TrimRight(site, "/"), machine, token, nil
}

// checkSiteURL checks a site agent's base URL: http or https, with a host, and nothing after
// its path.
func checkSiteURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL with a host (http://10.0.0.1:8067)", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q has a query or fragment; a base URL has neither", s)
	}
	return nil
}
