package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress/credstore"
	"github.com/space-sandbox/space/internal/server"
)

const credentialsUsage = `usage: space credentials rewrap --store DSN [--credential-keys FILE]
  re-seal every credential's data key with the first operator key (after
  adding a new first key to every replica); the old keys can go once it
  reports none left under them`

// credentialKeys reads the operator keyring from file, else from
// $SPACE_CREDENTIAL_KEYS; nil when neither is set, unless required.
func credentialKeys(file string, required bool) (*credstore.Keyring, error) {
	if file != "" {
		return credstore.KeyringFromFile(file)
	}
	if v := os.Getenv("SPACE_CREDENTIAL_KEYS"); v != "" {
		return credstore.ParseKeyring(v)
	}
	if required {
		return nil, usagef("the operator keys are required: --credential-keys FILE or $SPACE_CREDENTIAL_KEYS")
	}
	return nil, nil
}

func runCredentials(args []string) error {
	if len(args) == 0 || args[0] != "rewrap" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Println(credentialsUsage)
			return nil
		}
		return usagef("%s", credentialsUsage)
	}
	fs := flag.NewFlagSet("credentials rewrap", flag.ContinueOnError)
	store := fs.String("store", "", "the servers' postgres:// store (default $SPACE_STORE)")
	keysFile := fs.String("credential-keys", "", "file of operator keys, the new one first (default $SPACE_CREDENTIAL_KEYS)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 || !server.IsPostgres(storeOrDefault(*store)) {
		return usagef("%s", credentialsUsage)
	}
	keys, err := credentialKeys(*keysFile, true)
	if err != nil {
		return err
	}
	ctx := context.Background()
	st, err := server.OpenStore(ctx, storeOrDefault(*store), "", "", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	cs, ok := st.(core.CredentialStore)
	if !ok {
		return fmt.Errorf("the store keeps no credentials")
	}
	moved, missing, err := credstore.NewShared(cs, keys, nil).Rewrap(ctx)
	fmt.Printf("rewrapped %d credentials under key %s; %d sealed under keys this keyring lacks\n", moved, keys.ActiveID(), missing)
	if err != nil {
		return err
	}
	if missing > 0 {
		return fmt.Errorf("%d credentials are under keys not in this keyring: keep those keys until they are rewrapped", missing)
	}
	return nil
}
