// Package client proves the contextshift.v1 contract from Go: code generated from the same .proto
// as the server, calling a real server whose address is in CONTEXTSHIFT_ADDR (started by
// tests/integration/test_go_client.py).
package client

import (
	"context"
	"os"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	contextshiftv1 "contextshift/clients/go/gen/contextshift/v1"
)

func connect(t *testing.T) contextshiftv1.ContextShiftServiceClient {
	t.Helper()
	addr := os.Getenv("CONTEXTSHIFT_ADDR")
	if addr == "" {
		t.Fatal("CONTEXTSHIFT_ADDR is not set: run this through tests/integration/test_go_client.py")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return contextshiftv1.NewContextShiftServiceClient(conn)
}

func conversation() []*contextshiftv1.Block {
	return []*contextshiftv1.Block{
		{Id: "sys", Role: contextshiftv1.Role_ROLE_SYSTEM, Content: "You are a terse assistant."},
		{Id: "u1", Role: contextshiftv1.Role_ROLE_USER, Content: "Where is my order 1234? It was due last week and nothing came."},
		{Id: "a1", Role: contextshiftv1.Role_ROLE_ASSISTANT, ToolCalls: []*contextshiftv1.ToolCall{
			{Id: "call-1", Name: "order_status", Arguments: `{"order": 1234}`},
		}},
		{Id: "t1", Role: contextshiftv1.Role_ROLE_TOOL, ToolCallId: "call-1", Content: `{"status": "shipped", "eta": "Monday"}`},
		{Id: "a2", Role: contextshiftv1.Role_ROLE_ASSISTANT, Content: "It shipped and arrives on Monday."},
		{Id: "u2", Role: contextshiftv1.Role_ROLE_USER, Content: "Thanks!"},
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestShiftContextKeepsWhatFits(t *testing.T) {
	client := connect(t)
	limit := int64(10000)
	reserve := int64(0)
	resp, err := client.ShiftContext(ctx(t), &contextshiftv1.ShiftContextRequest{
		Blocks:          conversation(),
		ContextLimit:    &limit,
		ResponseReserve: &reserve,
		OutputFormat:    contextshiftv1.OutputFormat_OUTPUT_FORMAT_OPENAI_CHAT,
	})
	if err != nil {
		t.Fatal(err)
	}
	plan := resp.GetPlan()
	if len(plan.GetKept()) != 6 || len(plan.GetExcluded()) != 0 {
		t.Fatalf("kept %d, excluded %d; want 6, 0", len(plan.GetKept()), len(plan.GetExcluded()))
	}
	if plan.GetKept()[0].GetReason() != "PROTECTED_SYSTEM" || plan.GetBudget() != limit {
		t.Fatalf("unexpected plan %v", plan)
	}
	if len(resp.GetGenerationId()) != 36 {
		t.Fatalf("generation id %q is not a UUID", resp.GetGenerationId())
	}
	if plan.GetMessages().GetMessagesJson() == "" || !plan.GetApproximate() {
		t.Fatalf("unexpected messages or approximate flag: %v", plan)
	}
}

func TestShiftContextBudgetExceededCarriesErrorInfo(t *testing.T) {
	client := connect(t)
	limit := int64(20)
	_, err := client.ShiftContext(ctx(t), &contextshiftv1.ShiftContextRequest{Blocks: conversation(), ContextLimit: &limit})
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		t.Fatalf("want FAILED_PRECONDITION, got %v", err)
	}
	var info *errdetails.ErrorInfo
	for _, detail := range st.Details() {
		if d, ok := detail.(*errdetails.ErrorInfo); ok {
			info = d
		}
	}
	if info == nil {
		t.Fatalf("no ErrorInfo in %v", st.Details())
	}
	if info.GetReason() != "TOKEN_BUDGET_EXCEEDED" || info.GetDomain() != "contextshift.v1" {
		t.Fatalf("unexpected ErrorInfo %v", info)
	}
	// 20 less the default reserve, a quarter of the limit given: 15; protected: the system prompt
	// and the last input (17 tokens).
	if info.GetMetadata()["budget"] != "15" || info.GetMetadata()["protected_tokens"] == "" {
		t.Fatalf("unexpected metadata %v", info.GetMetadata())
	}
}

func TestBadBlockNamesTheField(t *testing.T) {
	client := connect(t)
	blocks := conversation()
	blocks[2].Role = contextshiftv1.Role_ROLE_UNSPECIFIED
	_, err := client.PreviewContext(ctx(t), &contextshiftv1.PreviewContextRequest{Blocks: blocks})
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("want INVALID_ARGUMENT, got %v", err)
	}
	for _, detail := range st.Details() {
		if bad, ok := detail.(*errdetails.BadRequest); ok && bad.GetFieldViolations()[0].GetField() == "blocks[2].role" {
			return
		}
	}
	t.Fatalf("no BadRequest naming blocks[2].role in %v", st.Details())
}

// A call naming a chat sends its id as x-chat-id metadata too, for a balancer to hash on (the
// README's Go example); a header naming another chat than the body is INVALID_ARGUMENT naming both.
func TestChatIdHeaderMustNameTheBodysChat(t *testing.T) {
	client := connect(t)
	limit := int64(10000)
	request := &contextshiftv1.ShiftContextRequest{Blocks: conversation(), ChatId: "go-chat", ContextLimit: &limit}
	if _, err := client.ShiftContext(metadata.AppendToOutgoingContext(ctx(t), "x-chat-id", request.GetChatId()), request); err != nil {
		t.Fatal(err)
	}
	_, err := client.ShiftContext(metadata.AppendToOutgoingContext(ctx(t), "x-chat-id", "another-chat"), request)
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("want INVALID_ARGUMENT, got %v", err)
	}
	for _, detail := range st.Details() {
		if bad, ok := detail.(*errdetails.BadRequest); ok {
			violations := bad.GetFieldViolations()
			if len(violations) == 2 && violations[0].GetField() == "x-chat-id" && violations[1].GetField() == "chat_id" {
				return
			}
		}
	}
	t.Fatalf("no BadRequest naming x-chat-id and chat_id in %v", st.Details())
}
