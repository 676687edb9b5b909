package api

import (
	"time"

	"github.com/google/uuid"
)

// ResourceWorkflow is the IAM resource type of workflow runs.
const ResourceWorkflow = "compute-workflow"

// The workflows group: runs of the durable procedures modules register (docs/workflows.md).
var (
	WorkflowsGet    = NewMethod[GetWorkflow, WorkflowRun]("workflows", "get", false, ResourceWorkflow, "v0.3", "Get a workflow run with the progress of each step.")
	WorkflowsList   = NewMethod[ListWorkflows, Page[WorkflowRun]]("workflows", "list", false, ResourceWorkflow, "v0.3", "List workflow runs, newest first, by workflow, subject or state.")
	WorkflowsCancel = NewMethod[GetWorkflow, WorkflowRun]("workflows", "cancel", true, ResourceWorkflow, "v0.3", "Cancel a workflow run that has not finished; a step in flight is stopped.")
)

// WorkflowMethods returns the workflows group.
func WorkflowMethods() []MethodInfo { return infos(workflowTable()) }

func workflowTable() []Describer { return []Describer{WorkflowsGet, WorkflowsList, WorkflowsCancel} }

// The states of a run.
const (
	WorkflowRunning   = "running"
	WorkflowSucceeded = "succeeded"
	WorkflowFailed    = "failed"
	WorkflowCancelled = "cancelled"
)

// The states of a step.
const (
	StepPending   = "pending"
	StepRunning   = "running"
	StepSucceeded = "succeeded"
	StepFailed    = "failed"
	StepCancelled = "cancelled"
)

// WorkflowRun is one run of a workflow.
type WorkflowRun struct {
	ID         string         `json:"id"`
	Workflow   string         `json:"workflow"`
	TenantID   string         `json:"tenantId"`
	Subject    string         `json:"subject"`
	State      string         `json:"state"`
	Step       string         `json:"step"` // the current step, or the last one once finished
	Steps      []WorkflowStep `json:"steps"`
	Error      string         `json:"error,omitempty"`
	CreatedBy  string         `json:"createdBy"`
	CreatedAt  time.Time      `json:"createdAt"`
	FinishedAt *time.Time     `json:"finishedAt,omitempty"`
}

// WorkflowStep is a step's progress.
type WorkflowStep struct {
	Name       string     `json:"name"`
	State      string     `json:"state"`
	Attempts   int        `json:"attempts"`
	Note       string     `json:"note,omitempty"` // what a waiting step waits for
	Error      string     `json:"error,omitempty"`
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
}

// GetWorkflow names a run.
type GetWorkflow struct {
	TenantID string `json:"tenantId,omitempty"`
	Run      string `json:"run"`
}

// Validate implements the input check.
func (in GetWorkflow) Validate() error {
	if uuid.Validate(in.Run) != nil {
		return InvalidField("run", "%q is not a workflow run's id", in.Run)
	}
	return nil
}

// ListWorkflows is the input of workflows.list.
type ListWorkflows struct {
	TenantID string `json:"tenantId,omitempty"`
	Workflow string `json:"workflow,omitempty"`
	Subject  string `json:"subject,omitempty"`
	State    string `json:"state,omitempty"`
	PageRequest
}

// Validate implements the input check.
func (in ListWorkflows) Validate() error {
	var errs []error
	if len(in.Workflow) > 128 {
		errs = append(errs, InvalidField("workflow", "is longer than 128 bytes"))
	}
	if len(in.Subject) > 256 {
		errs = append(errs, InvalidField("subject", "is longer than 256 bytes"))
	}
	errs = append(errs, ValidateEnum("state", in.State, WorkflowRunning, WorkflowSucceeded, WorkflowFailed, WorkflowCancelled), in.PageRequest.Validate())
	return first(errs...)
}
