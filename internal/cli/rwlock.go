package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

func (a *app) rwlockCommand() *cobra.Command {
	var lf lockFlags
	var read, write bool
	use := "tenure rwlock NAME --read|--write [flags] -- COMMAND [ARG...]"
	cmd := &cobra.Command{
		Use:   "rwlock NAME --read|--write [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding a read-write lock as a reader or the writer",
		Long: `Run COMMAND while holding the read-write lock NAME: with --read as one
of any number of readers, with --write as the only holder.

Policy: one FIFO queue for both kinds. A request is granted when it is at
the head of the queue and compatible with the holders (a reader: no writer
holds; the writer: nobody holds). A reader arriving while a writer waits
queues behind that writer, so a stream of readers cannot starve writers;
when a writer leaves, every reader at the head of the queue gets in
together. Each grant has its own fencing token (TENURE_FENCE_TOKEN).
Signals, the suspect rule and exit codes are those of 'tenure lock';
'tenure lock status NAME' shows the holders.`,
		Args: lockArgs(use, "lock"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if read == write {
				return errors.New("say --read or --write (exactly one)")
			}
			lf.shared = read
			return a.runLock(cmd.Context(), args[0], args[1:], lf)
		},
	}
	lockRunFlags(cmd, &lf)
	cmd.Flags().BoolVar(&read, "read", false, "hold it as a reader (shared)")
	cmd.Flags().BoolVar(&write, "write", false, "hold it as the writer (exclusive)")
	return cmd
}
