package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/space-sandbox/space/pkg/client"
)

func Example() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7070", os.Getenv("SPACE_API_KEY"))

	res, err := c.CreateSandbox(ctx, client.CreateRequest{Template: "base"}, "my-request-1")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, res.Operation.ID); err != nil {
		log.Fatal(err) // *client.OperationError if creation failed
	}
	defer c.DeleteSandbox(ctx, res.Sandbox.ID)

	sbx := c.Sandbox(res.Session)
	exit, err := sbx.Run(ctx, client.ExecRequest{Argv: []string{"python3", "-c", "print(6*7)"}}, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", exit.Code)
}
