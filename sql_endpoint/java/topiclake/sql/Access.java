package topiclake.sql;

import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.CurrentUserContext;

/**
 * What each principal of the SQL endpoint may do, as the Python side (sql_endpoint.server) computed
 * it from the API keys and their topic ACLs (delta_log.core.acl): the one rule lives there; this
 * class only holds its answers. Replaced whole, atomically, when keys or topics change.
 */
public final class Access {
  private record State(
      Map<String, byte[]> keyHashes,
      Set<String> admins,
      Map<String, Set<String>> readable,
      Map<String, List<String>> locations) {}

  private static volatile State state = new State(Map.of(), Set.of(), Map.of(), Map.of());
  private static volatile boolean open = false;  // closed until the driver says there are no keys
  /** The server's own session settings, as a JDBC session starts with them. */
  private static volatile Map<String, String> baseSettings = Map.of();
  /** The server's own session (the driver's: the catalog sync runs there); JDBC sessions are new ones. */
  private static volatile Object baseSession = null;
  /** What the Thrift server itself sets on each session it opens (kept: dates and times as java.time). */
  private static final Set<String> SERVER_SET = Set.of("spark.sql.datetime.java8api.enabled");
  /** What a JDBC user may SET (reading any setting is allowed): what BI tools set, nothing that loads code. */
  static final Set<String> SETTABLE = Set.of("spark.sql.session.timezone", "spark.sql.ansi.enabled");

  private Access() {}

  /** No keys configured: every login is accepted and every table readable (the read-only rule stays). */
  public static void setOpen(boolean value) {
    open = value;
  }

  /**
   * @param keyHashes principal -> SHA-256 of its API key (the key itself never reaches the JVM)
   * @param admins principals that may read every table (admin on every topic and group)
   * @param readable principal -> lower-case "database.table" names it may read and see
   * @param locations principal -> the folders of those tables ("authority/path", no scheme), whose
   *     files its queries may read (Delta reads a table's log and data files by path)
   */
  public static void set(
      Map<String, byte[]> keyHashes,
      Set<String> admins,
      Map<String, Set<String>> readable,
      Map<String, List<String>> locations) {
    state = new State(Map.copyOf(keyHashes), Set.copyOf(admins), Map.copyOf(readable), Map.copyOf(locations));
  }

  /** The settings JDBC sessions start from: the server's session's, taken before any user connects. */
  public static void captureBaseSettings(org.apache.spark.sql.classic.SparkSession session) {
    baseSettings = Map.copyOf(scala.jdk.javaapi.CollectionConverters.asJava(session.sessionState().conf().getAllConfs()));
    baseSession = session;
  }

  /**
   * Whether `session` is one the Thrift server opened for a JDBC client (any session but the
   * server's own, once captured): its statements run with its user's settings put back, whoever
   * runs them (the server runs a URL's use:database before it names the user).
   */
  static boolean isClientSession(Object session) {
    Object base = baseSession;
    return base != null && session != base;
  }

  /**
   * Puts back every setting of a user's session that differs from the server's, but those a user may
   * SET. A SET statement is checked by ReadOnlyAccess; settings in the JDBC URL (hiveconf:, or
   * ?key=value) are applied by the Thrift server when the session opens, before any statement, so a
   * catalog plugin or a data source option given there would be in force for the first query.
   */
  static void revertSessionSettings(org.apache.spark.sql.internal.SQLConf conf) {
    Map<String, String> base = baseSettings;
    scala.collection.immutable.Map<String, String> all = conf.getAllConfs();
    for (String key : scala.jdk.javaapi.CollectionConverters.asJava(all.keySet())) {
      String lower = key.toLowerCase(Locale.ROOT);
      if (SETTABLE.contains(lower) || SERVER_SET.contains(lower)) {
        continue;
      }
      String value = all.apply(key);
      String wanted = base.get(key);
      if (wanted == null) {
        conf.unsetConf(key);
      } else if (!wanted.equals(value)) {
        conf.setConfString(key, wanted);
      }
    }
  }

  /** A file or folder a query reads by path: inside a table folder the user may read. */
  public static boolean canReadPath(String user, URI path) {
    if (open || user == null) {
      return true;
    }
    State s = state;
    if (s.admins().contains(user)) {
      return true;
    }
    String raw = path.getPath();
    if (raw == null || hasDotSegment(raw)) {
      return false;  // "<table>/../<another>" names a folder outside the table: never compared as given
    }
    String authority = path.getAuthority() == null ? "" : path.getAuthority();
    String wanted = authority + raw;
    for (String folder : s.locations().getOrDefault(user, List.of())) {
      if (wanted.equals(folder) || wanted.startsWith(folder.endsWith("/") ? folder : folder + "/")) {
        return true;
      }
    }
    return false;
  }

  /** Whether a path has a "." or ".." segment (a folder check would compare the text, not the folder). */
  static boolean hasDotSegment(String path) {
    for (String segment : path.split("/", -1)) {
      if (segment.equals("..") || segment.equals(".")) {
        return true;
      }
    }
    return false;
  }

  /** The user of the JDBC operation running on this thread; null for the driver's own work. */
  public static String user() {
    return CurrentUserContext.CURRENT_USER().get();
  }

  static boolean authenticates(String user, String password) {
    byte[] expected = state.keyHashes().get(user);
    byte[] given = sha256(password);
    // compare in constant time, also for an unknown user
    return MessageDigest.isEqual(expected == null ? new byte[32] : expected, given) && expected != null;
  }

  /** canRead(user, "", "") is whether the user may read everything (an admin). */
  public static boolean canRead(String user, String database, String table) {
    if (open || user == null) {
      return true;
    }
    State s = state;
    if (s.admins().contains(user)) {
      return true;
    }
    if (table.isEmpty()) {
      return false;
    }
    Set<String> names = s.readable().get(user);
    String name = (database == null ? "default" : database) + "." + table;
    return names != null && names.contains(name.toLowerCase(Locale.ROOT));
  }

  static byte[] sha256(String text) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
