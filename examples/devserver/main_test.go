package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDevserverProcess builds and runs the real devserver binary, as the README tells a new user
// to, and talks to it with plain HTTP.
func TestDevserverProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the devserver binary")
	}
	bin := filepath.Join(t.TempDir(), "devserver")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-gateway", "127.0.0.1:0")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	urlRE := regexp.MustCompile(`URL:\s+(\S+)`)
	keyRE := regexp.MustCompile(`API key:\s+(\S+)`)
	hashRE := regexp.MustCompile(`CA hash:\s+(sha256:[0-9a-f]{64})`)
	var url, key, hash string
	lines := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	for (url == "" || key == "" || hash == "") && lines.Scan() {
		if m := hashRE.FindStringSubmatch(lines.Text()); m != nil {
			hash = m[1]
		}
		if m := urlRE.FindStringSubmatch(lines.Text()); m != nil {
			url = m[1]
		}
		if m := keyRE.FindStringSubmatch(lines.Text()); m != nil {
			key = m[1]
		}
	}
	deadline.Stop()
	if url == "" || key == "" || hash == "" {
		t.Fatal("the devserver did not print its URL, API key and CA hash")
	}
	go io.Copy(io.Discard, stdout)

	list := func(k string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", url+"/api/compute/pools/list", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	if status, body := list(key); status != 200 || body["items"] == nil {
		t.Fatalf("pools/list with the printed key = %d %v", status, body)
	}
	wrong := key[:len(key)-4] + "AAAA"
	if status, body := list(wrong); status != 401 || body["error"].(map[string]any)["code"] != "unauthenticated" {
		t.Fatalf("pools/list with a wrong key = %d %v, want 401 unauthenticated", status, body)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the devserver did not stop cleanly on Ctrl-C: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the devserver did not stop within 30s of Ctrl-C")
	}
}
