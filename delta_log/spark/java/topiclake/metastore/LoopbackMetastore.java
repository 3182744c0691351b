package topiclake.metastore;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.HiveMetaStore;
import org.apache.hadoop.hive.metastore.TSetIpAddressProcessor;
import org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.server.TThreadPoolServer;
import org.apache.thrift.transport.TServerSocket;
import org.apache.thrift.transport.TTransportFactory;

/**
 * Hive's metastore service (its handler, on the Derby database the --hiveconf settings name), served
 * on one address only: Hive 2.3's own main, HiveMetaStore, listens on every interface with no way
 * to choose, and this service has no authentication of its own.
 *
 * <p>java -cp pyspark/jars/*:this.jar topiclake.metastore.LoopbackMetastore HOST PORT [key=value ...]
 */
public final class LoopbackMetastore {
  private LoopbackMetastore() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 2) {
      System.err.println("usage: LoopbackMetastore HOST PORT [hive.key=value ...]");
      System.exit(2);
    }
    HiveConf conf = new HiveConf(HiveMetaStore.class);
    for (int i = 2; i < args.length; i++) {
      int eq = args[i].indexOf('=');
      conf.set(args[i].substring(0, eq), args[i].substring(eq + 1));
    }
    ThriftHiveMetastore.Iface handler = HiveMetaStore.newRetryingHMSHandler("topiclake metastore", conf, false);
    TServerSocket socket =
        new TServerSocket(new InetSocketAddress(InetAddress.getByName(args[0]), Integer.parseInt(args[1])));
    TThreadPoolServer.Args serverArgs = new TThreadPoolServer.Args(socket)
        .processor(new TSetIpAddressProcessor<>(handler))
        .transportFactory(new TTransportFactory())
        .protocolFactory(new TBinaryProtocol.Factory())
        .minWorkerThreads(2)
        .maxWorkerThreads(64);
    System.err.println("topiclake metastore listening on " + args[0] + ":" + args[1]);
    new TThreadPoolServer(serverArgs).serve();
  }
}
