package redfish_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/redfish"
)

// service is a Redfish service with one system, chassis and manager, following the DMTF schema
// (ServiceRoot, SessionService, ComputerSystem with its Reset action and Boot override,
// LogService SEL, Chassis Sensors, Manager VirtualMedia) for the calls the driver makes. It keeps
// what it was told, for the test to check. No Redfish emulator is packaged for Debian, hence
// this one.
type service struct {
	mu       sync.Mutex
	power    string // On, Off
	boot     map[string]any
	resets   []string
	image    string
	sessions map[string]bool
	logouts  int
}

func newService() *service {
	return &service{power: "Off", boot: map[string]any{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None"}, sessions: map[string]bool{}}
}

func link(p string) map[string]any { return map[string]any{"@odata.id": p} }

func collection(members ...string) map[string]any {
	ms := make([]any, len(members))
	for i, m := range members {
		ms[i] = link(m)
	}
	return map[string]any{"Members": ms, "Members@odata.count": len(ms)}
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if v != nil {
			_ = json.NewEncoder(w).Encode(v)
		}
	}
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	const sys, sessions = "/redfish/v1/Systems/1", "/redfish/v1/SessionService/Sessions"
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case p == "/redfish/v1" && r.Method == http.MethodGet: // the root needs no session
		reply(200, map[string]any{"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot", "Id": "RootService",
			"RedfishVersion": "1.6.0", "Systems": link("/redfish/v1/Systems"), "Chassis": link("/redfish/v1/Chassis"),
			"Managers": link("/redfish/v1/Managers"), "SessionService": link("/redfish/v1/SessionService"),
			"Links": map[string]any{"Sessions": link(sessions)}})
		return
	case p == sessions && r.Method == http.MethodPost:
		if body["UserName"] != "admin" || body["Password"] != "s3cret" {
			reply(401, map[string]any{"error": map[string]any{"code": "Base.1.0.NoValidSession", "message": "bad credentials"}})
			return
		}
		s.sessions["tok-1"] = true
		w.Header().Set("X-Auth-Token", "tok-1")
		w.Header().Set("Location", sessions+"/1")
		reply(201, map[string]any{"@odata.id": sessions + "/1", "Id": "1", "UserName": "admin"})
		return
	}
	if !s.sessions[r.Header.Get("X-Auth-Token")] {
		reply(401, map[string]any{"error": map[string]any{"code": "Base.1.0.NoValidSession", "message": "no session"}})
		return
	}
	switch {
	case p == sessions+"/1" && r.Method == http.MethodDelete:
		delete(s.sessions, "tok-1")
		s.logouts++
		reply(204, nil)
	case p == "/redfish/v1/Systems":
		reply(200, collection(sys))
	case p == sys && r.Method == http.MethodGet:
		boot := map[string]any{"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Hdd", "Cd", "BiosSetup"}}
		for k, v := range s.boot {
			boot[k] = v
		}
		reply(200, map[string]any{"@odata.id": sys, "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem", "Id": "1", "Name": "node",
			"PowerState": s.power, "Boot": boot, "LogServices": link(sys + "/LogServices"),
			"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{"target": sys + "/Actions/ComputerSystem.Reset",
				"ResetType@Redfish.AllowableValues": []string{"On", "ForceOff", "ForceRestart", "GracefulShutdown"}}}})
	case p == sys && r.Method == http.MethodPatch:
		b, _ := body["Boot"].(map[string]any)
		for k, v := range b {
			s.boot[k] = v
		}
		reply(204, nil)
	case p == sys+"/Actions/ComputerSystem.Reset" && r.Method == http.MethodPost:
		t, _ := body["ResetType"].(string)
		s.resets = append(s.resets, t)
		switch t {
		case "On", "ForceRestart":
			s.power = "On"
		case "ForceOff", "GracefulShutdown":
			s.power = "Off"
		default:
			reply(400, map[string]any{"error": map[string]any{"code": "Base.1.0.ActionParameterValueNotInList", "message": t}})
			return
		}
		reply(204, nil)
	case p == sys+"/LogServices":
		reply(200, collection(sys+"/LogServices/SEL"))
	case p == sys+"/LogServices/SEL":
		reply(200, map[string]any{"@odata.id": p, "Id": "SEL", "LogEntryType": "SEL", "Entries": link(p + "/Entries")})
	case p == sys+"/LogServices/SEL/Entries":
		reply(200, collection(p+"/1"))
	case p == sys+"/LogServices/SEL/Entries/1":
		reply(200, map[string]any{"@odata.id": p, "Id": "1", "EntryType": "SEL", "Created": "2026-12-01T10:00:00Z",
			"Message": "Temperature upper critical going high", "SensorType": "Temperature", "SensorNumber": 48})
	case p == "/redfish/v1/Chassis":
		reply(200, collection("/redfish/v1/Chassis/1"))
	case p == "/redfish/v1/Chassis/1":
		reply(200, map[string]any{"@odata.id": p, "Id": "1", "Name": "chassis", "Sensors": link(p + "/Sensors")})
	case p == "/redfish/v1/Chassis/1/Sensors":
		reply(200, collection(p+"/CPU1Temp"))
	case p == "/redfish/v1/Chassis/1/Sensors/CPU1Temp":
		reply(200, map[string]any{"@odata.id": p, "Id": "CPU1Temp", "Name": "CPU1 Temp", "Reading": 57, "ReadingType": "Temperature",
			"ReadingUnits": "Cel", "Status": map[string]any{"Health": "OK", "State": "Enabled"}})
	case p == "/redfish/v1/Managers":
		reply(200, collection("/redfish/v1/Managers/1"))
	case p == "/redfish/v1/Managers/1":
		reply(200, map[string]any{"@odata.id": p, "Id": "1", "Name": "BMC", "VirtualMedia": link(p + "/VirtualMedia")})
	case p == "/redfish/v1/Managers/1/VirtualMedia":
		reply(200, collection(p+"/CD"))
	case p == "/redfish/v1/Managers/1/VirtualMedia/CD" && r.Method == http.MethodGet:
		reply(200, map[string]any{"@odata.id": p, "Id": "CD", "MediaTypes": []string{"CD", "DVD"}, "Image": s.image, "Inserted": s.image != "",
			"Actions": map[string]any{"#VirtualMedia.InsertMedia": map[string]any{"target": p + "/Actions/VirtualMedia.InsertMedia"},
				"#VirtualMedia.EjectMedia": map[string]any{"target": p + "/Actions/VirtualMedia.EjectMedia"}}})
	case p == "/redfish/v1/Managers/1/VirtualMedia/CD/Actions/VirtualMedia.InsertMedia" && r.Method == http.MethodPost:
		s.image, _ = body["Image"].(string)
		reply(204, nil)
	case p == "/redfish/v1/Managers/1/VirtualMedia/CD/Actions/VirtualMedia.EjectMedia" && r.Method == http.MethodPost:
		s.image = ""
		reply(204, nil)
	default:
		reply(404, map[string]any{"error": map[string]any{"code": "Base.1.0.ResourceMissingAtURI", "message": r.Method + " " + p}})
	}
}

// TestPowerBootSensorsLogAndMediaOverRedfish drives the service over HTTPS with sessions.
func TestPowerBootSensorsLogAndMediaOverRedfish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc := newService()
	srv := httptest.NewTLSServer(svc)
	defer srv.Close()
	b := power.BMC{Address: srv.URL, Username: "admin", Password: "s3cret"}

	if _, err := (redfish.Driver{}).State(ctx, b); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a self-signed BMC without Insecure: %v, want a certificate error", err)
	}
	d := redfish.Driver{Insecure: true}
	if s, err := d.State(ctx, b); err != nil || s != power.Off {
		t.Fatalf("state = %q, %v; want off", s, err)
	}
	for _, a := range []power.Action{power.ActionOn, power.ActionCycle, power.ActionSoft, power.ActionOn, power.ActionOff} {
		if err := d.Set(ctx, b, a); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
	}
	if s, _ := d.State(ctx, b); s != power.Off {
		t.Errorf("after off the state is %q", s)
	}
	// PowerCycle is not among the system's reset types: cycle falls back to ForceRestart.
	if got, want := strings.Join(svc.resets, " "), "On ForceRestart GracefulShutdown On ForceOff"; got != want {
		t.Errorf("reset types posted %q, want %q", got, want)
	}
	if err := d.Set(ctx, b, "explode"); err == nil {
		t.Error("an unknown action was accepted")
	}

	if err := d.SetBootDevice(ctx, b, power.BootPXE, false); err != nil {
		t.Fatal(err)
	}
	if dev, err := d.BootDevice(ctx, b); err != nil || dev != power.BootPXE || svc.boot["BootSourceOverrideEnabled"] != "Once" || svc.boot["BootSourceOverrideMode"] != "UEFI" {
		t.Errorf("boot = %q, %v; the service holds %v; want pxe, once, UEFI", dev, err, svc.boot)
	}
	if err := d.SetBootDevice(ctx, b, power.BootDisk, true); err != nil {
		t.Fatal(err)
	}
	if dev, _ := d.BootDevice(ctx, b); dev != power.BootDisk || svc.boot["BootSourceOverrideEnabled"] != "Continuous" {
		t.Errorf("boot = %q with %v, want disk, continuous", dev, svc.boot)
	}
	if err := d.SetBootDevice(ctx, b, power.BootNone, false); err != nil {
		t.Fatal(err)
	}
	if dev, _ := d.BootDevice(ctx, b); dev != power.BootNone {
		t.Errorf("boot after none = %q", dev)
	}

	sensors, err := d.Sensors(ctx, b)
	if err != nil || len(sensors) != 1 || sensors[0].Name != "CPU1 Temp" || sensors[0].Value != 57 || sensors[0].Unit != "Cel" || sensors[0].Status != "OK" {
		t.Errorf("sensors = %+v, %v", sensors, err)
	}
	sel, err := d.SEL(ctx, b)
	if err != nil || len(sel) != 1 || sel[0].Sensor != 48 || !strings.Contains(sel[0].Description, "critical") || sel[0].At.IsZero() {
		t.Errorf("SEL = %+v, %v", sel, err)
	}

	if err := d.InsertMedia(ctx, b, "http://10.0.0.1/ramdisk.iso"); err != nil || svc.image != "http://10.0.0.1/ramdisk.iso" {
		t.Errorf("insert: %v; the CD holds %q", err, svc.image)
	}
	if err := d.EjectMedia(ctx, b); err != nil || svc.image != "" {
		t.Errorf("eject: %v; the CD holds %q", err, svc.image)
	}

	if len(svc.sessions) != 0 || svc.logouts < 10 {
		t.Errorf("%d sessions open, %d logouts: every call must close its session", len(svc.sessions), svc.logouts)
	}
	wrong := b
	wrong.Password = "guess"
	if _, err := d.State(ctx, wrong); err == nil {
		t.Error("a wrong password was let in")
	}
	if _, err := d.State(ctx, power.BMC{Address: "10.0.0.5:443", Username: "admin"}); err == nil {
		t.Error("an address that is not a URL was accepted")
	}
}
