package api

import (
	"regexp"
	"strconv"
	"time"
)

// ResourceEvent is the IAM resource type of the event log.
const ResourceEvent = "compute-event"

// Event is one entry of the event log: a change, written in the transaction that made it. ID is
// its place in the log, 1, 2, 3, … with no gap: the order in which events became visible, which
// a reader that resumes after an id relies on (see docs/events.md).
type Event struct {
	ID        int64          `json:"id"`
	Type      string         `json:"type"` // e.g. reservation.created
	TenantID  string         `json:"tenantId"`
	Subject   string         `json:"subject"` // the id of what it is about
	Data      map[string]any `json:"data"`
	CreatedAt time.Time      `json:"createdAt"`
}

// EventsList lists a tenant's events in log order.
var EventsList = NewMethod[ListEvents, Page[Event]]("events", "list", false, ResourceEvent, "v0.2",
	"List a tenant's events in log order, after an event id or a cursor; filter by type or subject.")

// EventMethods returns the events group.
func EventMethods() []MethodInfo { return infos(eventTable()) }

func eventTable() []Describer { return []Describer{EventsList} }

// ListEvents is the input of events.list. After is the id of the last event seen (as the event
// stream's Last-Event-ID); a cursor, when given, is used instead.
type ListEvents struct {
	TenantID string `json:"tenantId,omitempty"`
	After    int64  `json:"after,omitempty" input:"int8"`
	Type     string `json:"type,omitempty"`    // an event type, or a prefix ending in "." (e.g. "node.")
	Subject  string `json:"subject,omitempty"` // the id of what the events are about
	PageRequest
}

var eventTypeFilter = regexp.MustCompile(`^[a-z]+(\.[a-z_]+)*\.?$`)

// Validate implements the input check.
func (in ListEvents) Validate() error {
	var errs []error
	if in.After < 0 {
		errs = append(errs, InvalidField("after", "must be an event id (≥ 0), got %d", in.After))
	}
	if in.Type != "" && (len(in.Type) > 128 || !eventTypeFilter.MatchString(in.Type)) {
		errs = append(errs, InvalidField("type", "%q is not an event type (e.g. node.offline) or a prefix (e.g. node.)", in.Type))
	}
	if len(in.Subject) > 256 {
		errs = append(errs, InvalidField("subject", "is longer than 256 bytes"))
	}
	return first(append(errs, in.PageRequest.Validate())...)
}

// EventCursor is the cursor of events.list that resumes after event id.
func EventCursor(id int64) string { return EncodeCursor("e1", strconv.FormatInt(id, 10)) }

// EventAfter is the event id a list input resumes after: its cursor's, or After.
func (in ListEvents) EventAfter() (int64, error) {
	if in.Cursor == "" {
		return in.After, nil
	}
	key, err := DecodeCursor("e1", in.Cursor)
	if err != nil {
		return 0, err
	}
	id, err := strconv.ParseInt(key, 10, 64)
	if err != nil || id < 0 {
		return 0, InvalidField("cursor", "is not a cursor returned by this API")
	}
	return id, nil
}

// EventStreamPath is where the API serves the event log as Server-Sent Events, below BasePath.
const EventStreamPath = "/events/stream"
