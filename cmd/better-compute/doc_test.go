package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
	"github.com/better-compute/compute/sim"
	"github.com/better-compute/compute/vps"

	"github.com/better-compute/compute/computetest"
)

// A doc command is a better-compute command line in a fenced sh block of README.md or docs/*.md.
type docCommand struct {
	File string // relative to the repository root
	Line int    // where it starts
	Text string // as written, continuation lines included, without a trailing comment
}

func (c docCommand) String() string { return fmt.Sprintf("%s:%d: %s", c.File, c.Line, c.Text) }

// docSkipped are the doc commands a test cannot run, by their text, each with the reason. Every
// other better-compute command in a doc runs (TestDocCommands), so a new one is checked unless
// it is listed here; an entry no doc holds any more fails the test.
var docSkipped = map[string]string{
	// Long-running: they serve or follow until interrupted.
	"better-compute dev --sim 2":                          "long-running: the test runs its own devserver",
	"better-compute serve …":                              "long-running: the control plane until SIGTERM",
	"better-compute events watch --type reservation.":     "follows the log until interrupted",
	"better-compute events watch --from-now --type node.": "follows the log until interrupted",
	"better-compute workflows watch --run <run>":          "follows a run until it ends: the test's power run waits for a site agent that is not there",
	"better-compute rollouts watch <id>":                  "follows a rollout until it ends: the simulated node never installs the release (bcd/release_e2e_test.go runs one)",
	// Tunnels: simulated nodes run no commands and have no consoles.
	"better-compute exec --reservation $RES -- nvidia-smi":                                                                "needs a node running bcd node --exec (bcd/tunnel_e2e_test.go)",
	"better-compute exec --reservation $RES -t -- bash":                                                                   "needs a node running bcd node --exec, and a terminal (bcd/tunnel_e2e_test.go)",
	"echo hi | better-compute exec --reservation $RES -- cat":                                                             "needs a node running bcd node --exec (bcd/tunnel_e2e_test.go)",
	"better-compute console --reservation $RES":                                                                           "needs a node with a console (bcd node --console; bcd/tunnel_e2e_test.go)",
	"better-compute console --reservation $RES --console vm-0":                                                            "needs a node with a console named vm-0 (bcd/tunnel_e2e_test.go)",
	`better-compute exec --node gpu-001 --pool h100 --break-glass --reason "pager: GPU 3 fell off the bus" -- nvidia-smi`: "needs a node running bcd node --exec (bcd/tunnel_e2e_test.go)",
	// VMs: simulated nodes run no VM runtime.
	`better-compute call instances.create --json '{"name": "web", "pool": "gpu", "flavor": "small", "image": "debian", "networks": [{"network": "lan"}], "userData": "#cloud-config\npackages: [nginx]\n"}'`: "needs a VM host labelled vm=yes (bcd node --vps-runtime; vps/host_e2e_test.go)",
	"better-compute console --instance web":                                                       "needs the instance, on a VM host (vps/host_e2e_test.go)",
	`better-compute call sandboxes.create --json '{"template": "py", "name": "job-1"}'`:           "needs a VM host (bcd node --vps-runtime; vps/sandbox_e2e_test.go)",
	`better-compute call sandboxSnapshots.create --json '{"sandbox": "job-1", "name": "before"}'`: "needs the sandbox, on a VM host",
	`better-compute call sandboxSnapshots.restore --json '{"snapshot": "<id>"}'`:                  "needs the snapshot, of a sandbox on a VM host",
	`better-compute call sandboxes.extend --json '{"sandbox": "job-1", "ttl": "1h"}'`:             "needs the sandbox, on a VM host",
	`better-compute call sandboxes.delete --json '{"sandbox": "job-1"}'`:                          "needs the sandbox, on a VM host",
}

var (
	fenceOpen   = regexp.MustCompile("^```sh\\s*$")
	isDocCLI    = regexp.MustCompile(`(^|[|;&]\s*)better-compute\s`)
	lastFenceRe = regexp.MustCompile("^```")
)

// docCommands reads the better-compute commands of README.md and docs/*.md under root.
func docCommands(root string) ([]docCommand, error) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var out []docCommand
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, f)
		out = append(out, shellCommands(rel, string(b))...)
	}
	return out, nil
}

// shellCommands are the better-compute commands of one document's sh blocks: a line, with the
// lines a trailing backslash or an open quote continue it into, less a trailing comment and a
// "$ " prompt.
func shellCommands(file, doc string) []docCommand {
	var out []docCommand
	in, other := false, false
	var cur []string
	start := 0
	for i, line := range strings.Split(doc, "\n") {
		switch {
		case !in && !other && fenceOpen.MatchString(line):
			in = true
			continue
		case !in && lastFenceRe.MatchString(line):
			other = !other
			continue
		case in && lastFenceRe.MatchString(line):
			in, cur = false, nil
			continue
		case !in:
			continue
		}
		if len(cur) == 0 {
			start = i + 1
		}
		cur = append(cur, line)
		text, complete := stripComment(strings.Join(cur, "\n"))
		if !complete {
			continue
		}
		cur = nil
		text = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "$ "))
		if isDocCLI.MatchString(text) {
			out = append(out, docCommand{File: file, Line: start, Text: text})
		}
	}
	return out
}

// stripComment removes a shell comment from s and says whether s is a whole command: no quote
// left open, no backslash at its end.
func stripComment(s string) (string, bool) {
	var quote rune
	prev := ' '
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return strings.TrimRight(s[:i], " \t"), true
		}
		prev = r
	}
	if quote != 0 || strings.HasSuffix(strings.TrimRight(s, " \t"), "\\") {
		return s, false
	}
	return strings.TrimRight(s, " \t"), true
}

// TestDocCommandsAreFound: the extraction reads what a reader would run.
func TestDocCommandsAreFound(t *testing.T) {
	t.Parallel()
	doc := "text\n```sh\nbetter-compute pools list   # a comment\n$ better-compute call x.y --json '{\"a\": 1,\n  \"b\": \"#2\"}'\n" +
		"echo hi | better-compute exec -- cat\nbetter-compute a \\\n  --b c\ngo install ./cmd/better-compute\n```\n```go\nbetter-compute no\n```\n"
	got := shellCommands("x.md", doc)
	want := []docCommand{
		{"x.md", 3, "better-compute pools list"},
		{"x.md", 4, "better-compute call x.y --json '{\"a\": 1,\n  \"b\": \"#2\"}'"},
		{"x.md", 6, "echo hi | better-compute exec -- cat"},
		{"x.md", 7, "better-compute a \\\n  --b c"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("shellCommands =\n%v\nwant\n%v", got, want)
	}
}

// docEnv is where the doc commands run: one devserver, a shell per command in a working
// directory and $HOME of the test's, and what earlier commands printed.
type docEnv struct {
	t       *testing.T
	bin     string
	dir     string
	home    string
	env     []string
	s       *devserver.Server
	cl      *client.Client
	outputs []string          // every command's stdout, in order
	ids     []string          // the id of each created thing's answer, in order
	vars    map[string]string // placeholders (<name>, prefix_…) a document's setup fills
	// before runs just before the command of that text: what a reader does by hand in between
	// (edits a file, waits for something to exist).
	before map[string]func()
	skip   map[string]string // commands this machine cannot run, with why (a missing tool)
}

// docSetups prepare what a document's commands take as given (the placeholders they name, the
// files they read), before its first command runs.
var docSetups = map[string]func(e *docEnv){
	"docs/access.md":    accessSetup,
	"docs/events.md":    eventsSetup,
	"docs/fleet.md":     fleetSetup,
	"docs/iam.md":       iamSetup,
	"docs/releases.md":  releasesSetup,
	"docs/sandboxes.md": sandboxesSetup,
	"docs/vps.md":       vpsSetup,
	"docs/workflows.md": workflowsSetup,
}

// ctx is a context for a setup's calls.
func (e *docEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *docEnv) must(err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *docEnv) write(name, content string) {
	e.t.Helper()
	e.must(os.MkdirAll(filepath.Dir(name), 0o700))
	e.must(os.WriteFile(name, []byte(content), 0o600))
}

// docPatience bounds the waits of the documents' commands on what the devserver does.
const docPatience = 45 * time.Second

// accessSetup: $RES is a reservation of the simulated pool, and the reader has an SSH key.
func accessSetup(e *docEnv) {
	r, err := e.cl.Reservations.Create(e.ctx(), api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 1}})
	e.must(err)
	e.t.Cleanup(func() {
		_, _ = e.cl.Reservations.Release(context.Background(), api.ReleaseReservation{Reservation: r.ID})
	})
	e.env = append(e.env, "RES="+r.ID)
	pub, _, err := ed25519.GenerateKey(nil)
	e.must(err)
	key, err := ssh.NewPublicKey(pub)
	e.must(err)
	e.write(filepath.Join(e.home, ".ssh", "id_ed25519.pub"), string(ssh.MarshalAuthorizedKey(key)))
	if _, err := exec.LookPath("jq"); err != nil {
		e.skip[`better-compute access ssh-certificate --reservation $RES --public-key "$(cat ~/.ssh/id_ed25519.pub)" -o json \
  | jq -r .certificate > ~/.ssh/id_ed25519-cert.pub`] = "jq is not installed"
	}
}

// eventsSetup: the log has more than 130 events, in a checkpoint of the audit tree, so that
// --after 120 --count 10 and --seq 120 name events that are there; <delivery> is one of the
// webhook's deliveries, once webhooks test made one.
func eventsSetup(e *docEnv) {
	ctx := e.ctx()
	for {
		var last int64
		e.must(e.s.DB.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM compute.events`).Scan(&last))
		if last > 130 {
			break
		}
		r, err := e.cl.Reservations.Create(ctx, api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 1}})
		e.must(err)
		_, err = e.cl.Reservations.Release(ctx, api.ReleaseReservation{Reservation: r.ID})
		e.must(err)
	}
	e.before["better-compute audit checkpoint -o json > checkpoint.json"] = func() {
		computetest.Eventually(e.t, docPatience, "a checkpoint of 120 events", func() bool {
			cp, err := e.cl.Audit.Checkpoint(ctx, api.GetCheckpoint{})
			return err == nil && cp.Size >= 120
		})
	}
	e.before["better-compute webhooks redeliver <delivery>"] = func() {
		computetest.Eventually(e.t, docPatience, "the test event's delivery", func() bool {
			page, err := e.cl.Webhooks.Deliveries(ctx, api.ListWebhookDeliveries{Webhook: e.ids[len(e.ids)-1]})
			e.must(err)
			if len(page.Items) > 0 {
				e.vars["delivery"] = fmt.Sprint(page.Items[0].ID)
			}
			return len(page.Items) > 0
		})
	}
}

// fleetSetup: the reader's edit ($EDITOR fleet.yaml) adds a site.
func fleetSetup(e *docEnv) {
	e.before["better-compute fleet plan -f fleet.yaml --prune"] = func() {
		name := filepath.Join(e.dir, "fleet.yaml")
		b, err := os.ReadFile(name)
		e.must(err)
		var doc map[string]any
		e.must(yaml.Unmarshal(b, &doc))
		spec, _ := doc["spec"].(map[string]any)
		sites, _ := spec["sites"].([]any)
		spec["sites"] = append(sites, map[string]any{"name": "fra1", "displayName": "Frankfurt 1"})
		b, err = yaml.Marshal(doc)
		e.must(err)
		e.write(name, string(b))
	}
}

// iamSetup: policy.json is a policy document; <person> and <agent> are a user and an agent of
// the root tenant; cfm_… is a confirmation the agent's call asked for, once the delegation is
// there.
func iamSetup(e *docEnv) {
	e.write(filepath.Join(e.dir, "policy.json"),
		`{"version": 1, "statements": [{"sid": "reserve", "effect": "allow", "actions": ["compute:reservations:*"], "resources": ["compute-reservation/*"]}]}`)
	ctx := e.ctx()
	person, err := e.s.IAM.CreateIdentity(ctx, devserver.RootTenantID, iam.KindUser, "ada")
	e.must(err)
	agent, err := e.s.IAM.CreateIdentity(ctx, devserver.RootTenantID, iam.KindAgent, "bot")
	e.must(err)
	e.vars["person"], e.vars["agent"] = person.ID, agent.ID
	e.before["better-compute iam confirmation approve cfm_… --person <person>"] = func() {
		role, err := e.s.IAM.CreateRole(ctx, devserver.RootTenantID, "bot-reserves", iam.Policy{Version: 1, Statements: []iam.Statement{
			{Effect: "allow", Actions: []string{"compute:reservations:*"}, Resources: []string{"*"}}}})
		e.must(err)
		e.must(e.s.IAM.Bind(ctx, agent.ID, role.ID, devserver.RootTenantID))
		key, err := e.s.IAM.CreateAPIKey(ctx, agent.ID, "bot", time.Time{})
		e.must(err)
		bot, err := client.New(e.s.URL, client.WithAPIKey(key.Token))
		e.must(err)
		_, err = bot.Reservations.Create(ctx, api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 1}})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeConfirmationRequired {
			e.t.Fatalf("the agent's call = %v, want confirmation_required", err)
		}
		e.vars["cfm_…"] = fmt.Sprint(ae.Details["confirmationId"])
	}
}

// releasesSetup: ./bcd is a build, and h100 a pool with a (simulated) node to roll it out to.
func releasesSetup(e *docEnv) {
	ctx := e.ctx()
	e.write(filepath.Join(e.dir, "bcd"), "#!/bin/sh\necho a build of bcd v1.4.0\n")
	_, err := e.cl.Pools.Create(ctx, api.CreatePool{Name: "h100"})
	e.must(err)
	tok, err := e.cl.JoinTokens.Create(ctx, api.CreateJoinToken{Pool: "h100"})
	e.must(err)
	f, err := sim.Start(context.WithoutCancel(ctx), sim.Options{URL: e.s.URL, Token: tok.Token, Nodes: 1, Prefix: "h100"})
	e.must(err)
	e.t.Cleanup(f.Stop)
	e.must(f.WaitConnected(ctx))
}

// sandboxesSetup: the flavor "small" and the image "python" the template names. The flavor is
// deleted after (its name free again): docs/vps.md makes its own.
func sandboxesSetup(e *docEnv) {
	ctx := e.ctx()
	_, err := client.Call(ctx, e.cl, vps.FlavorsCreate, vps.CreateFlavor{Name: "small", VCPUs: 2, MemoryGiB: 4})
	e.must(err)
	e.t.Cleanup(func() {
		_, err := client.Call(context.Background(), e.cl, vps.FlavorsDelete, vps.FlavorRef{Flavor: "small"})
		e.must(err)
	})
	_, err = client.Call(ctx, e.cl, vps.VMImagesRegister, vps.RegisterVMImage{Name: "python",
		Disk: &vps.Artifact{URL: "https://images.example.com/python.qcow2", SHA256: strings.Repeat("ab", 32)}})
	e.must(err)
}

// vpsSetup: <its SHA-256> is an image's.
func vpsSetup(e *docEnv) {
	e.vars["its SHA-256"] = strings.Repeat("ab", 32)
}

// workflowsSetup: <machine> is a machine, and <run> the run powering it on (which waits for its
// site's agent).
func workflowsSetup(e *docEnv) {
	ctx := e.ctx()
	_, err := e.cl.Sites.Create(ctx, api.CreateSite{Name: "dc1"})
	e.must(err)
	m, err := client.Call(ctx, e.cl, metal.MachinesCreate, metal.CreateMachine{Name: "m1", Site: "dc1",
		BMC: metal.BMCInput{Driver: "ipmi", Address: "10.0.0.5:623", Username: "admin", Password: "secret"}})
	e.must(err)
	run, err := client.Call(ctx, e.cl, metal.MachinesPower, metal.PowerMachine{Machine: m.ID, Action: "on"})
	e.must(err)
	e.vars["machine"], e.vars["run"] = m.ID, run.Run
}

// TestDocCommands runs every better-compute command of the docs' sh blocks against a devserver
// with simulated nodes and the metal and vps modules (as better-compute dev runs), in the order
// each document gives them, and checks that each succeeds. Placeholders are filled from what
// the earlier commands printed: <id> is the id of the last answer that had one, idn_… (any
// prefix_…) the last such id printed, sha256:… the last fingerprint, $RES and <name> what the
// document's setup made.
func TestDocCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI and runs a devserver")
	}
	cmds, err := docCommands("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range cmds {
		seen[c.Text] = true
	}
	for text := range docSkipped {
		if !seen[text] {
			t.Errorf("docSkipped lists %q, which no doc holds any more", text)
		}
	}
	bin := build(t)
	dbURL := pgtest.URL(t)
	t.Setenv(postgres.EnvDatabaseURL, dbURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := devserver.Start(ctx, devserver.Options{Sim: 2, Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Modules: func(url string) ([]compute.Module, error) {
			m, err := metal.New(metal.Options{JoinURL: url})
			if err != nil {
				return nil, err
			}
			v, err := vps.New(vps.Options{})
			return []compute.Module{m, v}, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	home := t.TempDir()
	cl, err := client.New(s.URL, client.WithAPIKey(s.APIKey))
	if err != nil {
		t.Fatal(err)
	}
	byFile := map[string][]docCommand{}
	var files []string
	for _, c := range cmds {
		if byFile[c.File] == nil {
			files = append(files, c.File)
		}
		byFile[c.File] = append(byFile[c.File], c)
	}
	sort.Strings(files)
	for _, f := range files {
		t.Run(strings.ReplaceAll(f, "/", "_"), func(t *testing.T) {
			e := &docEnv{t: t, bin: bin, dir: t.TempDir(), home: home, s: s, cl: cl, vars: map[string]string{},
				before: map[string]func(){}, skip: map[string]string{}}
			e.env = []string{"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
				"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
				"BETTER_COMPUTE_URL=" + s.URL, "BETTER_COMPUTE_API_KEY=" + s.APIKey, postgres.EnvDatabaseURL + "=" + dbURL}
			if setup := docSetups[f]; setup != nil {
				setup(e)
			}
			for _, c := range byFile[f] {
				if why, ok := docSkipped[c.Text]; ok {
					t.Logf("skipped %s: %s", c, why)
					continue
				}
				if why, ok := e.skip[c.Text]; ok {
					t.Logf("skipped %s on this machine: %s", c, why)
					continue
				}
				if before := e.before[c.Text]; before != nil {
					before()
				}
				e.run(c)
			}
		})
	}
}

var (
	placeholderRe = regexp.MustCompile(`<[^<>]+>`)
	prefixedRe    = regexp.MustCompile(`\b([a-z]+_)…`)
	fingerprintRe = regexp.MustCompile(`sha256:[0-9a-f]{64}`)
	idRowRe       = regexp.MustCompile(`(?m)^id\s+(\S+)\s*$`)
	idColumnRe    = regexp.MustCompile(`(?m)^ID\s.*\n(\S+)`)
	// createsRe: a command whose answer's id <id> names afterwards.
	createsRe = regexp.MustCompile(`[ .](create|register)\b`)
)

// fill replaces a command's placeholders, or fails the test naming the one it cannot fill.
func (e *docEnv) fill(c docCommand) string {
	text := placeholderRe.ReplaceAllStringFunc(c.Text, func(p string) string {
		name := p[1 : len(p)-1]
		if v, ok := e.vars[name]; ok {
			return v
		}
		if name == "id" && len(e.ids) > 0 {
			return e.ids[len(e.ids)-1]
		}
		e.t.Fatalf("%s: no value for %s: an earlier command's answer has none, and the doc test's setup for %s sets none", c, p, c.File)
		return ""
	})
	text = prefixedRe.ReplaceAllStringFunc(text, func(p string) string {
		if v, ok := e.vars[p]; ok {
			return v
		}
		prefix := strings.TrimSuffix(p, "…")
		re := regexp.MustCompile(`\b` + regexp.QuoteMeta(prefix) + `[A-Za-z0-9_-]+`)
		for i := len(e.outputs) - 1; i >= 0; i-- {
			if all := re.FindAllString(e.outputs[i], -1); len(all) > 0 {
				return all[len(all)-1]
			}
		}
		e.t.Fatalf("%s: no earlier answer printed an id like %s", c, p)
		return ""
	})
	text = strings.ReplaceAll(text, "sha256:…", e.last(c, fingerprintRe, "sha256:…"))
	if strings.Contains(text, "…") {
		e.t.Fatalf("%s: an elision (…) the test cannot fill: write a placeholder (<name>) the doc test's setup sets, or skip it in docSkipped", c)
	}
	return text
}

// last is the last match of re in what earlier commands printed.
func (e *docEnv) last(c docCommand, re *regexp.Regexp, what string) string {
	if !strings.Contains(c.Text, what) {
		return what
	}
	for i := len(e.outputs) - 1; i >= 0; i-- {
		if all := re.FindAllString(e.outputs[i], -1); len(all) > 0 {
			return all[len(all)-1]
		}
	}
	e.t.Fatalf("%s: no earlier answer printed a %s", c, what)
	return ""
}

// run runs one doc command with sh and fails the test unless it succeeds.
func (e *docEnv) run(c docCommand) {
	text := e.fill(c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", text)
	// A command past its time is ended with the shell's whole process group, so that nothing
	// it started keeps the output open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), e.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	e.t.Logf("%s (%s)", c, time.Since(began).Round(time.Millisecond))
	if err != nil {
		e.t.Errorf("%s\nran: %s\n%v\nstdout:\n%s\nstderr:\n%s", c, text, err, &stdout, &stderr)
	}
	out := stdout.String()
	e.outputs = append(e.outputs, out)
	if !createsRe.MatchString(c.Text) {
		return
	}
	if m := idRowRe.FindStringSubmatch(out); m != nil {
		e.ids = append(e.ids, m[1])
	} else if m := idColumnRe.FindStringSubmatch(out); m != nil {
		e.ids = append(e.ids, m[1])
	}
}
